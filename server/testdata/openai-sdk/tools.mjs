// Tool calling through the official OpenAI Node SDK, unchanged, against
// a stepserve serving tiny-llama (random weights): tool_choice required
// must give a parsed call of an offered function with valid arguments,
// and auto text or a call, never a malformed one. Prints what it saw as
// JSON for server/openai_sdk_test.go to check.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.STEPSERVE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
const model = "tiny-llama";
const n = Number(process.env.RUNS ?? 50);
const tools = JSON.parse(process.env.TOOLS);
const messages = [{ role: "user", content: "What is the weather in Paris?" }];
const out = { required: [], streamed: [], auto: [], answered: null };

const callsOf = (m) => (m.tool_calls ?? []).map((c) => ({ id: c.id, type: c.type, name: c.function.name, arguments: c.function.arguments }));
for (let seed = 0; seed < n; seed++) {
  const c = await client.chat.completions.create({ model, messages, tools, tool_choice: "required", max_tokens: 200, temperature: 1, seed });
  out.required.push({ calls: callsOf(c.choices[0].message), finish: c.choices[0].finish_reason });
}
// The SDK's stream helper assembles the calls' deltas.
for (let seed = 0; seed < 10; seed++) {
  const runner = client.chat.completions.stream({ model, messages, tools, tool_choice: "required", max_tokens: 200, temperature: 1, seed: 500 + seed });
  const final = await runner.finalChatCompletion();
  out.streamed.push({ calls: callsOf(final.choices[0].message), finish: final.choices[0].finish_reason });
}
for (let seed = 0; seed < 10; seed++) {
  const c = await client.chat.completions.create({ model, messages, tools, tool_choice: "auto", max_tokens: 40, temperature: 1, seed: 900 + seed });
  const m = c.choices[0].message;
  out.auto.push({ calls: callsOf(m), content: m.content, finish: c.choices[0].finish_reason });
}
// The call and its result go back, and the model answers.
const first = out.required[0].calls[0];
const c = await client.chat.completions.create({ model, max_tokens: 8, tools, messages: [...messages,
  { role: "assistant", content: null, tool_calls: [{ id: first.id, type: "function", function: { name: first.name, arguments: first.arguments } }] },
  { role: "tool", tool_call_id: first.id, content: "sunny, 21 C" }] });
out.answered = c.choices[0].finish_reason;
console.log(JSON.stringify(out));
