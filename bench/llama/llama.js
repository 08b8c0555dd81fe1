// llama.cpp (node-llama-cpp's prebuilt CPU binaries) as the peer of
// stepserve's generation: bench/llamapeer starts it with a GGUF file and
// sends one JSON line a measurement on stdin; it answers one JSON line on
// stdout. Prompts are token ids and generation is greedy, so the tokens
// can be compared with stepserve's one for one.
//
//   node bench/llama/llama.js MODEL.gguf THREADS SEQUENCES
//   in:  {"prompts": [[1, 2, ...], ...], "n": 128}
//   out: {"tokens": [[...], ...], "ttft": [s, ...], "first": [s, ...], "last": [s, ...], "wall": s}
//
// One prompt runs on a context of one sequence; several run together on
// a context of SEQUENCES sequences, which llama.cpp decodes as one batch.
import readline from 'node:readline';
import { getLlama, LlamaLogLevel } from 'node-llama-cpp';

async function main() {
  const [modelPath, threadsArg, sequencesArg] = process.argv.slice(2);
  const threads = Number(threadsArg);
  const sequences = Number(sequencesArg);
  const llama = await getLlama({
    gpu: false,
    build: 'never',
    usePrebuiltBinaries: true,
    maxThreads: threads,
    logLevel: LlamaLogLevel.error,
  });
  const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
  const contextSize = 2560;
  const one = await model.createContext({ contextSize, sequences: 1, threads: { ideal: threads, min: threads }, batchSize: 512 });
  const many = await model.createContext({ contextSize, sequences, threads: { ideal: threads, min: threads }, batchSize: 512 });
  const rl = readline.createInterface({ input: process.stdin });
  process.stdout.write(JSON.stringify({ ready: true, version: llama.llamaCppRelease?.release ?? '', cpu: llama.cpuMathCores }) + '\n');
  for await (const line of rl) {
    const q = JSON.parse(line);
    const ctx = q.prompts.length === 1 ? one : many;
    if (q.prompts.length > sequences) throw new Error(`${q.prompts.length} prompts on a context of ${sequences} sequences`);
    const seqs = q.prompts.map(() => ctx.getSequence());
    const start = process.hrtime.bigint();
    const secs = () => Number(process.hrtime.bigint() - start) / 1e9;
    const results = await Promise.all(q.prompts.map(async (prompt, i) => {
      const seq = seqs[i];
      const out = { tokens: [], ttft: 0, last: 0 };
      // temperature 0: the most likely token, no penalties.
      for await (const token of seq.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
        const t = secs();
        if (out.tokens.length === 0) out.ttft = t;
        out.tokens.push(token);
        out.last = t;
        if (out.tokens.length >= q.n) break;
      }
      return out;
    }));
    const wall = secs();
    for (const seq of seqs) {
      await seq.clearHistory();
      seq.dispose();
    }
    process.stdout.write(JSON.stringify({
      tokens: results.map((r) => r.tokens),
      ttft: results.map((r) => r.ttft),
      first: results.map((r) => r.ttft),
      last: results.map((r) => r.last),
      wall,
    }) + '\n');
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
