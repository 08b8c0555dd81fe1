// The official OpenAI Node SDK, unchanged, against a stepserve serving
// tiny-llama: models, completions and chat completions, whole and
// streamed, and an error. Prints what it saw as JSON for
// server/openai_sdk_test.go to check.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.STEPSERVE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
const model = "tiny-llama";
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const params = { model, prompt: "Once upon a time", max_tokens: 24, temperature: 0, ignore_eos: true };
const c = await client.completions.create(params);
out.completion = { text: c.choices[0].text, finish: c.choices[0].finish_reason, usage: c.usage };
let streamed = "";
for await (const chunk of await client.completions.create({ ...params, stream: true })) {
  streamed += chunk.choices[0]?.text ?? "";
}
out.completionStream = streamed;

const chat = { model, messages: [{ role: "user", content: "Hello!" }], max_completion_tokens: 24, temperature: 0, seed: 7, ignore_eos: true };
const cc = await client.chat.completions.create(chat);
out.chat = { content: cc.choices[0].message.content, role: cc.choices[0].message.role, finish: cc.choices[0].finish_reason, usage: cc.usage };
streamed = "";
let usage = null;
let finish = null;
const stream = await client.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } });
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  const choice = chunk.choices[0];
  if (choice?.delta?.content) streamed += choice.delta.content;
  if (choice?.finish_reason) finish = choice.finish_reason;
}
out.chatStream = { content: streamed, usage, finish };

// The SDK's own helper, which assembles a stream into a completion.
const runner = client.chat.completions.stream({ ...chat });
const final = await runner.finalChatCompletion();
out.chatHelper = final.choices[0].message.content;

try {
  await client.chat.completions.create({ ...chat, n: 65 });
  out.error = "no error";
} catch (e) {
  out.error = { status: e.status, param: e.param, type: e.type, message: e.message };
}
console.log(JSON.stringify(out));
