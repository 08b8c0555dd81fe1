// Hugging Face's JS inference client (@huggingface/inference), unchanged,
// against a stepserve serving a language model: textGeneration and
// textGenerationStream at the endpoint's URL, as a user of a TGI endpoint
// calls them (this client version posts them to the endpoint's
// /v1/completions, naming the endpoint's URL as the model, with TGI's
// parameters beside the prompt), and an error. Prints what it saw as JSON
// for server/hf_inference_test.go to check.
import { InferenceClient } from "@huggingface/inference";

const base = process.env.STEPSERVE_URL;
const ep = new InferenceClient().endpoint(base);
const out = {};
const args = { inputs: "the cat sat on", parameters: { max_new_tokens: 12, temperature: 0, return_full_text: false, do_sample: false } };

out.text = await ep.textGeneration(args);
out.chunks = [];
for await (const chunk of ep.textGenerationStream(args)) {
  out.chunks.push(chunk);
}
try {
  await ep.textGeneration({ inputs: "x", parameters: { max_new_tokens: 0 } });
  out.error = "no error";
} catch (e) {
  out.error = { name: e.name, status: e.httpResponse?.status, message: e.httpResponse?.body?.error?.message };
}
console.log(JSON.stringify(out));
