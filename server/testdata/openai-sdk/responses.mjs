// OpenAI's Responses API through the official OpenAI Node SDK, unchanged,
// against a stepserve serving tiny-llama (random weights): text whole and
// streamed (the SDK's stream helper accumulating the events into the
// final response), text.format json_schema, a function call round trip
// (tool_choice required, then the call's output sent back as an input
// item), previous_response_id, and GET/DELETE of a stored response.
// Prints what it saw as JSON for server/openai_sdk_test.go to check.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.STEPSERVE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
const model = "tiny-llama";
const schema = JSON.parse(process.env.SCHEMA);
const out = {};

const r = await client.responses.create({ model, input: "Say hi.", instructions: "Be brief.", max_output_tokens: 12, temperature: 0 });
out.text = { text: r.output_text, status: r.status, usage: r.usage, id: r.id, object: r.object, incomplete: r.incomplete_details };

const stream = client.responses.stream({ model, input: "Say hi.", instructions: "Be brief.", max_output_tokens: 12, temperature: 0 });
out.events = [];
let deltas = "";
for await (const ev of stream) {
  out.events.push(ev.type);
  if (ev.type === "response.output_text.delta") deltas += ev.delta;
}
const final = await stream.finalResponse();
const textOf = (resp) => resp.output.filter((o) => o.type === "message").flatMap((o) => o.content.map((c) => c.text)).join("");
out.streamed = { text: textOf(final), deltas };

// A stream that completes (the schema ends it): the SDK's final response
// is the server's response.completed, as the same request answers whole.
const format = { format: { type: "json_schema", name: "thing", schema, strict: true } };
const ended = client.responses.stream({ model, input: "Describe a thing.", max_output_tokens: 200, temperature: 0, text: format });
out.completedEvents = [];
for await (const ev of ended) out.completedEvents.push(ev.type);
const endedFinal = await ended.finalResponse();
const endedWhole = await client.responses.create({ model, input: "Describe a thing.", max_output_tokens: 200, temperature: 0, text: format });
out.completed = { text: textOf(endedFinal), status: endedFinal.status, usage: endedFinal.usage, whole: endedWhole.output_text, wholeUsage: endedWhole.usage };

const structured = await client.responses.create({ model, input: "Describe a thing.", max_output_tokens: 200, temperature: 1,
  text: { format: { type: "json_schema", name: "thing", schema, strict: true } } });
out.structured = { text: structured.output_text, status: structured.status };

const tools = JSON.parse(process.env.TOOLS).map((t) => ({ type: "function", name: t.function.name, description: t.function.description ?? "", parameters: t.function.parameters, strict: true }));
const call = await client.responses.create({ model, input: "What is the weather in Paris?", tools, tool_choice: "required", max_output_tokens: 100, temperature: 1 });
const fc = call.output.find((o) => o.type === "function_call");
out.call = { types: call.output.map((o) => o.type), name: fc?.name, arguments: fc?.arguments, callId: fc?.call_id };
const back = await client.responses.create({ model, tools, max_output_tokens: 8, temperature: 0,
  input: [{ role: "user", content: "What is the weather in Paris?" }, fc, { type: "function_call_output", call_id: fc.call_id, output: "sunny, 21 C" }] });
out.back = { status: back.status, types: back.output.map((o) => o.type) };

const followUp = await client.responses.create({ model, previous_response_id: r.id, input: "And again?", max_output_tokens: 6, temperature: 0 });
out.followUp = { status: followUp.status, previous: followUp.previous_response_id, inputTokens: followUp.usage.input_tokens, firstInput: r.usage.input_tokens };

out.stored = (await client.responses.retrieve(r.id)).output_text;
await client.responses.delete(r.id);
try {
  await client.responses.retrieve(r.id);
  out.deleted = "still there";
} catch (e) {
  out.deleted = e.status;
}
try {
  await client.responses.create({ model, input: "x", previous_response_id: "resp_nope" });
  out.error = "no error";
} catch (e) {
  out.error = { status: e.status, param: e.param };
}
console.log(JSON.stringify(out));
