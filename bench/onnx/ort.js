// ONNX Runtime (onnxruntime-node, CPU execution provider) as the peer of
// stepserve's CPU engine: bench/ortpeer starts it and sends one JSON line a
// measurement on stdin; it answers one JSON line on stdout.
//
//   node bench/onnx/ort.js MODEL.onnx THREADS
//   in:  {"dir": "...", "case": "16x128", "batch": 16, "seq": 128, "seconds": 1}
//   out: {"runs": N, "seconds": S}  (and writes DIR/CASE.ort.bin, the pooled output)
'use strict';

const fs = require('fs');
const path = require('path');
const readline = require('readline');
const ort = require('onnxruntime-node');

async function main() {
  const [model, threads] = process.argv.slice(2);
  const session = await ort.InferenceSession.create(model, {
    executionProviders: ['cpu'],
    intraOpNumThreads: Number(threads),
    interOpNumThreads: 1,
    graphOptimizationLevel: 'all',
    // ORT_SPIN=0 turns off the intra-op threads' spin-waiting (on by default).
    extra: { session: { intra_op: { allow_spinning: process.env.ORT_SPIN ?? '1' } } },
  });
  const feeds = new Map();
  const rl = readline.createInterface({ input: process.stdin });
  process.stdout.write(JSON.stringify({ ready: true, version: ort.env.versions.common }) + '\n');
  for await (const line of rl) {
    const q = JSON.parse(line);
    const key = q.case;
    if (!feeds.has(key)) {
      const read = (kind) => {
        const b = fs.readFileSync(path.join(q.dir, `${q.case}.${kind}.bin`));
        return new BigInt64Array(b.buffer, b.byteOffset, b.length / 8);
      };
      const ids = read('ids');
      const dims = [q.batch, q.seq];
      feeds.set(key, {
        input_ids: new ort.Tensor('int64', ids, dims),
        attention_mask: new ort.Tensor('int64', read('mask'), dims),
        token_type_ids: new ort.Tensor('int64', new BigInt64Array(ids.length), dims),
      });
    }
    const feed = feeds.get(key);
    let out = await session.run(feed); // warm-up, and the output checked
    fs.writeFileSync(path.join(q.dir, `${q.case}.ort.bin`), Buffer.from(out.embedding.data.buffer, out.embedding.data.byteOffset, out.embedding.data.byteLength));
    let runs = 0;
    const start = process.hrtime.bigint();
    let elapsed = 0;
    while (runs < 2 || elapsed < q.seconds) {
      out = await session.run(feed);
      runs++;
      elapsed = Number(process.hrtime.bigint() - start) / 1e9;
    }
    process.stdout.write(JSON.stringify({ runs, seconds: elapsed }) + '\n');
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
