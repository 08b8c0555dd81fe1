// Anthropic's official TypeScript SDK, unchanged, against a stepserve
// serving tiny-llama: messages.create with a system prompt and turns,
// messages.stream (its events assembled by the SDK), a tool call round
// trip (tool_choice any: the grammar makes the call), countTokens, and
// an error. Prints what it saw as JSON for server/anthropic_sdk_test.go.
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({ baseURL: process.env.STEPSERVE_URL, apiKey: process.env.API_KEY, maxRetries: 0 });
const model = "tiny-llama";
const messages = [
  { role: "user", content: "Hello" },
  { role: "assistant", content: "Hi." },
  { role: "user", content: "Tell me a story." },
];
const out = {};

const m = await client.messages.create({ model, max_tokens: 16, system: "Be brief.", messages, temperature: 0 });
out.create = { id: m.id, type: m.type, role: m.role, text: m.content[0]?.text, stop: m.stop_reason, usage: m.usage };

const stream = client.messages.stream({ model, max_tokens: 16, system: "Be brief.", messages, temperature: 0 });
let deltas = "";
stream.on("text", (t) => { deltas += t; });
const final = await stream.finalMessage();
out.stream = { text: final.content[0]?.text, deltas, stop: final.stop_reason, usage: final.usage };

const tools = [{ name: "add", description: "Adds two numbers.", input_schema: JSON.parse(process.env.SCHEMA) }];
const call = await client.messages.create({ model, max_tokens: 200, messages, tools, tool_choice: { type: "any" }, temperature: 1 });
const use = call.content.find((b) => b.type === "tool_use");
out.tool = { stop: call.stop_reason, name: use?.name, input: use?.input, id: use?.id };
const answer = await client.messages.create({ model, max_tokens: 8, tools, messages: [...messages,
  { role: "assistant", content: call.content },
  { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "5" }] }] });
out.roundTrip = answer.stop_reason;

const streamedCall = client.messages.stream({ model, max_tokens: 200, messages, tools, tool_choice: { type: "tool", name: "add" }, temperature: 1 });
const sc = await streamedCall.finalMessage();
const su = sc.content.find((b) => b.type === "tool_use");
out.streamTool = { stop: sc.stop_reason, name: su?.name, input: su?.input };

const count = await client.messages.countTokens({ model, system: "Be brief.", messages });
out.count = count.input_tokens;

try {
  await client.messages.create({ model: "no-such-model", max_tokens: 4, messages });
} catch (e) {
  out.error = { status: e.status, type: e.error?.error?.type, name: e.constructor.name };
}
console.log(JSON.stringify(out));
