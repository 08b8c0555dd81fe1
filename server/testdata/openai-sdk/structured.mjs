// Structured output through the official OpenAI Node SDK, unchanged,
// against a stepserve serving tiny-llama (random weights: only the
// constraint can make its output valid). Prints what it saw as JSON for
// server/openai_sdk_test.go to check: every output, whole and streamed,
// of response_format json_schema, and of the SDK's parse helper with a
// zod schema.
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";

const client = new OpenAI({ baseURL: process.env.STEPSERVE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
const model = "tiny-llama";
const n = Number(process.env.RUNS ?? 50);
const schema = JSON.parse(process.env.SCHEMA);
const messages = [{ role: "user", content: "Describe a thing as JSON." }];
const format = { type: "json_schema", json_schema: { name: "thing", strict: true, schema } };
const out = { whole: [], streamed: [], parsed: [] };

for (let seed = 0; seed < n; seed++) {
  const c = await client.chat.completions.create({ model, messages, max_tokens: 200, temperature: 1, seed, response_format: format });
  out.whole.push({ content: c.choices[0].message.content, finish: c.choices[0].finish_reason });
}
for (let seed = 0; seed < n; seed++) {
  let content = "";
  let finish = null;
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 200, temperature: 1, seed: 1000 + seed, response_format: format, stream: true });
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (choice?.delta?.content) content += choice.delta.content;
    if (choice?.finish_reason) finish = choice.finish_reason;
  }
  out.streamed.push({ content, finish });
}

// The SDK's parse helper with a zod schema: it sends the schema zod
// converts to, and parses the answer with zod.
const Thing = z.object({
  name: z.string().max(6),
  ok: z.boolean(),
  color: z.enum(["red", "green", "blue"]),
  tags: z.array(z.enum(["a", "b"])).max(3),
});
for (let seed = 0; seed < n; seed++) {
  const c = await client.chat.completions.parse({ model, messages, max_tokens: 200, temperature: 1, seed: 2000 + seed, response_format: zodResponseFormat(Thing, "thing") });
  const m = c.choices[0].message;
  out.parsed.push({ parsed: m.parsed, content: m.content, finish: c.choices[0].finish_reason });
}
console.log(JSON.stringify(out));
