// The `ai` package's own client side against rillet's UI message stream route: the chat
// transport `useChat` uses by default sends each request, and `readUIMessageStream` assembles
// the streamed parts into the message a front end shows. Reads the jobs as JSON on stdin and
// prints, per job, the parts received, the last message assembled and any error, as JSON.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const spec = JSON.parse(readFileSync(0, "utf8"));
const {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithToolCalls,
  readUIMessageStream,
} = await import(pathToFileURL(spec.entry).href);

async function send(messages, { key = spec.key, body = {} } = {}) {
  const transport = new DefaultChatTransport({
    api: spec.url,
    headers: key ? { authorization: `Bearer ${key}` } : {},
    body,
  });
  const chunks = [];
  const errors = [];
  let message = null;
  try {
    const stream = await transport.sendMessages({
      chatId: "chat-1",
      messages,
      abortSignal: undefined,
      trigger: "submit-message",
      messageId: undefined,
    });
    const [seen, read] = stream.tee();
    const collecting = (async () => {
      for await (const chunk of seen) chunks.push(chunk);
    })();
    for await (const snapshot of readUIMessageStream({
      stream: read,
      onError: (error) => errors.push(String(error?.message ?? error)),
    })) {
      message = structuredClone(snapshot);
    }
    await collecting;
  } catch (error) {
    errors.push(String(error?.message ?? error));
    return { chunks, message, errors, status: error?.statusCode ?? null };
  }
  return { chunks, message, errors, status: null };
}

const user = (id, text) => ({ id, role: "user", parts: [{ type: "text", text }] });
const out = {};
for (const job of spec.jobs) {
  out[job.name] = await send([user("u1", job.text)], job);
}
// a tool call round trip: the client runs the tool and sends its output back
const asked = out.tool.message;
const answered = structuredClone(asked);
for (const part of answered.parts) {
  if (part.type.startsWith("tool-")) {
    part.state = "output-available";
    part.output = { temperature: "18 °C", sky: "pluie fine" };
  }
}
out.tool_answer = await send([user("u1", "WEATHER in Paris?"), answered]);

// the same round trip as `useChat` drives it: `@ai-sdk/react`'s `Chat` is this `AbstractChat`
// over React state; here the state is a plain array. The tool runs in `onToolCall`, and the
// output is sent back on its own (`sendAutomaticallyWhen`), continuing the assistant message.
class State {
  status = "ready";
  error = undefined;
  messages = [];
  pushMessage = (m) => void this.messages.push(m);
  popMessage = () => void this.messages.pop();
  replaceMessage = (i, m) => void (this.messages[i] = m);
  snapshot = (v) => structuredClone(v);
}
const state = new State();
const chat = new AbstractChat({
  id: "chat-2",
  state,
  transport: new DefaultChatTransport({
    api: spec.url,
    headers: { authorization: `Bearer ${spec.key}` },
    body: { tools: spec.tools },
  }),
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls,
  onToolCall: ({ toolCall }) => {
    chat.addToolOutput({
      tool: toolCall.toolName,
      toolCallId: toolCall.toolCallId,
      output: { temperature: "18 °C", sky: "pluie fine" },
    });
  },
});
await chat.sendMessage({ text: "WEATHER in Paris?" });
for (let i = 0; i < 200 && (state.status !== "ready" || chat.activeResponse); i++) {
  await new Promise((resolve) => setTimeout(resolve, 25));
}
out.chat = { messages: state.messages, status: state.status, error: String(state.error ?? "") };
process.stdout.write(JSON.stringify(out));
