// The Vercel AI SDK and LangChain.js, unchanged, against a stepserve
// serving tiny-llama (random weights: only the constraint can make its
// output valid): the AI SDK's generateObject, streamObject and tool
// calls, and LangChain's withStructuredOutput and bindTools. Prints what
// they returned as JSON for server/js_frameworks_test.go to check.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, streamObject, generateText, tool } from "ai";
import { ChatOpenAI } from "@langchain/openai";
import { z } from "zod";

const baseURL = process.env.STEPSERVE_URL + "/v1";
const n = Number(process.env.RUNS ?? 10);
const Thing = z.object({
  name: z.string().max(6),
  ok: z.boolean(),
  color: z.enum(["red", "green", "blue"]),
  tags: z.array(z.enum(["a", "b"])).max(3),
});
const weatherInput = z.object({ city: z.string().max(8), unit: z.enum(["c", "f"]) });
const out = { aiObject: [], aiStream: [], aiTools: [], lcStructured: [], lcJSONSchema: [], lcTools: [] };

const provider = createOpenAICompatible({ name: "stepserve", baseURL, apiKey: "unused", supportsStructuredOutputs: true });
const model = provider.chatModel("tiny-llama");
for (let seed = 0; seed < n; seed++) {
  const { object } = await generateObject({ model, schema: Thing, prompt: "Describe a thing.", temperature: 1, seed, maxOutputTokens: 200, maxRetries: 0 });
  out.aiObject.push(object);
  const s = streamObject({ model, schema: Thing, prompt: "Describe a thing.", temperature: 1, seed: 100 + seed, maxOutputTokens: 200, maxRetries: 0 });
  for await (const partial of s.partialObjectStream) void partial; // the object resolves once the stream is read
  out.aiStream.push(await s.object);
  const r = await generateText({
    model, prompt: "Weather in Paris?", temperature: 1, seed: 200 + seed, maxOutputTokens: 200, maxRetries: 0, toolChoice: "required",
    tools: { get_weather: tool({ description: "The weather in a city.", inputSchema: weatherInput }) },
  });
  out.aiTools.push(r.toolCalls.map((c) => ({ name: c.toolName, input: c.input })));
}

const llm = new ChatOpenAI({ model: "tiny-llama", apiKey: "unused", configuration: { baseURL }, temperature: 1, maxTokens: 200, maxRetries: 0 });
for (let i = 0; i < n; i++) {
  out.lcStructured.push(await llm.withStructuredOutput(Thing, { name: "thing" }).invoke("Describe a thing."));
  out.lcJSONSchema.push(await llm.withStructuredOutput(Thing, { name: "thing", method: "jsonSchema" }).invoke("Describe a thing."));
  const msg = await llm.bindTools([{ type: "function", function: { name: "get_weather", description: "The weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 }, unit: { enum: ["c", "f"] } }, required: ["city", "unit"], additionalProperties: false } } }],
  { tool_choice: "required" }).invoke("Weather in Paris?");
  out.lcTools.push(msg.tool_calls.map((c) => ({ name: c.name, input: c.args })));
}
console.log(JSON.stringify(out));
