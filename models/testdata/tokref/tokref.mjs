// tokref tokenizes with transformers.js (@huggingface/tokenizers) for the
// Go tests: it reads a JSON request file (argv[2]) of
// [{file: "tokenizer.json", cases: [{text, pair?}]}] and prints
// [[{ids, type_ids}, ...], ...], one list per file.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const jobs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = jobs.map((job) => {
  const tok = new Tokenizer(JSON.parse(readFileSync(job.file, "utf8")), {});
  return job.cases.map((c) => {
    const e = tok.encode(c.text, { text_pair: c.pair ?? null, return_token_type_ids: true });
    return { ids: e.ids, type_ids: e.token_type_ids ?? null };
  });
});
process.stdout.write(JSON.stringify(out));
