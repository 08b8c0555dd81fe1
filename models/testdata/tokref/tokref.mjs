// tokref tokenizes with transformers.js (@huggingface/tokenizers) for the
// Go tests: it reads a JSON request file (argv[2]) of
// [{file: "tokenizer.json", cases: [{text, pair?}]}] and prints
// [[{ids, type_ids, text, text_skip}, ...], ...], one list per file: text
// and text_skip are the ids decoded, with the special tokens and without.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const jobs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = jobs.map((job) => {
  const tok = new Tokenizer(JSON.parse(readFileSync(job.file, "utf8")), {});
  return job.cases.map((c) => {
    const e = tok.encode(c.text, { text_pair: c.pair ?? null, return_token_type_ids: true });
    return {
      ids: e.ids,
      type_ids: e.token_type_ids ?? null,
      // The decoder's text, as tokenizers' Rust gives it: transformers'
      // clean_up_tokenization_spaces is a tokenizer_config.json option
      // applied after, not the decoder's.
      text: tok.decode(e.ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
      text_skip: tok.decode(e.ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
    };
  });
});
process.stdout.write(JSON.stringify(out));
