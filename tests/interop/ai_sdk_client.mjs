// The `ai` package's own client side against rillet's UI message stream route: the chat
// transport `useChat` uses by default sends each request, and `readUIMessageStream` assembles
// the streamed parts into the message a front end shows. Reads the jobs as JSON on stdin and
// prints, per job, the parts received, the last message assembled and any error, as JSON.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const spec = JSON.parse(readFileSync(0, "utf8"));
const { DefaultChatTransport, readUIMessageStream } = await import(
  pathToFileURL(spec.entry).href
);

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
process.stdout.write(JSON.stringify(out));
