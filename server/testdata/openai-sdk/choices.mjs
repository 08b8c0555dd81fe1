// n, prompt arrays, echo and penalties through the official OpenAI Node
// SDK, unchanged, against a stepserve serving tiny-llama. Prints what it
// saw as JSON for server/openai_sdk_test.go to check.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.STEPSERVE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
const model = "tiny-llama";
const texts = (c) => c.choices.map((ch) => ch.text);
const out = {};
const prompt = "Once upon a time";
out.greedy = texts(await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, n: 3 }));
out.seeded = texts(await client.completions.create({ model, prompt, max_tokens: 8, temperature: 1, seed: 9, n: 3 }));
out.seededAgain = texts(await client.completions.create({ model, prompt, max_tokens: 8, temperature: 1, seed: 9, n: 3 }));
const prompts = ["one", "two two", "three three three", "four"];
const arr = await client.completions.create({ model, prompt: prompts, max_tokens: 5, temperature: 0 });
out.array = arr.choices.map((ch) => ({ index: ch.index, text: ch.text }));
out.alone = [];
for (const p of prompts) {
  out.alone.push((await client.completions.create({ model, prompt: p, max_tokens: 5, temperature: 0 })).choices[0].text);
}
out.echo = (await client.completions.create({ model, prompt, max_tokens: 5, temperature: 0, echo: true })).choices[0].text;
out.plain = (await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0 })).choices[0].text;
out.penalized = (await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0, frequency_penalty: 2, presence_penalty: 1 })).choices[0].text;
out.chat = (await client.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 6, temperature: 1, seed: 4, n: 2 }))
  .choices.map((ch) => ch.message.content);
console.log(JSON.stringify(out));
