// The `ai` package's `AbstractChat` (what `useChat` drives) against a rillet server that runs
// its own tools: one chat whose tool runs on the server, and chats whose tool needs approval,
// answered with `addToolApprovalResponse` (approved, then denied) and sent back automatically
// (`lastAssistantMessageIsCompleteWithApprovalResponses`). Reads its spec as JSON on stdin;
// prints each chat's messages, the data parts it saw, its status and error, as JSON.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const spec = JSON.parse(readFileSync(0, "utf8"));
const { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } =
  await import(pathToFileURL(spec.entry).href);

class State {
  status = "ready";
  error = undefined;
  messages = [];
  pushMessage = (m) => void this.messages.push(m);
  popMessage = () => void this.messages.pop();
  replaceMessage = (i, m) => void (this.messages[i] = m);
  snapshot = (v) => structuredClone(v);
}

async function settle(chat, state) {
  for (let i = 0; i < 400 && (state.status !== "ready" || chat.activeResponse); i++) {
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

async function converse(id, text, approved) {
  const state = new State();
  const data = [];
  const chat = new AbstractChat({
    id,
    state,
    transport: new DefaultChatTransport({ api: spec.url }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onData: (part) => data.push(part),
  });
  await chat.sendMessage({ text });
  await settle(chat, state);
  const asked = [];
  for (const message of state.messages) {
    for (const part of message.parts) {
      if (part.state === "approval-requested") asked.push(structuredClone(part));
    }
  }
  if (approved !== null && asked.length) {
    await chat.addToolApprovalResponse({ id: asked[0].approval.id, approved, reason: "no" });
    await settle(chat, state);
  }
  return { messages: state.messages, asked, data, status: state.status, error: String(state.error ?? "") };
}

const out = {
  runs: await converse("chat-run", "weather please", null),
  approved: await converse("chat-yes", "delete it", true),
  denied: await converse("chat-no", "delete it", false),
};
process.stdout.write(JSON.stringify(out));
