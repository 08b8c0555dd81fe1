// Hugging Face's JS inference client (@huggingface/inference), unchanged,
// against a stepserve serving tiny-encoder, a classifier and others: feature
// extraction, sentence similarity and text classification, each through
// the endpoint TEI names for it and through POST / or /invocations (which
// choose by the model's kind), with the inference token, and an error.
// Prints what it saw as JSON for server/hf_inference_test.go to check.
//
// The client posts to endpointUrl as it is and takes no model name in the
// body, so the model goes in ?model= where several could answer.
import { InferenceClient } from "@huggingface/inference";

const base = process.env.STEPSERVE_URL;
const client = new InferenceClient(process.env.STEPSERVE_TOKEN);
const at = (path) => client.endpoint(base + path);
const out = {};

out.features = await at("/embed").featureExtraction({ inputs: ["hello world", "a second text"] });
out.featuresRoot = await at("/?model=tiny-encoder").featureExtraction({ inputs: "hello world" });

const sim = { inputs: { source_sentence: "what is a bucket?", sentences: ["a compiled shape", "what is a bucket?"] } };
out.similarity = await at("/similarity").sentenceSimilarity(sim);
out.similarityRoot = await at("/invocations?model=tiny-encoder").sentenceSimilarity(sim);

// The client takes the first of a list of lists (the old Inference API's
// answer); TEI, and stepserve with it, answer a list of lists for a batch
// of inputs and a flat list for one text, so the text goes as a batch of
// one.
const text = { inputs: [["I love this"]] };
out.classification = await at("/predict?model=classifier").textClassification(text);
out.classificationRoot = await at("/?model=classifier").textClassification(text);

try {
  await at("/embed").featureExtraction({ inputs: [] });
  out.error = "no error";
} catch (e) {
  out.error = { name: e.name, status: e.httpResponse?.status, message: e.message, body: e.httpResponse?.body };
}
console.log(JSON.stringify(out));
