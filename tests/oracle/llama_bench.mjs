// llama.cpp (prebuilt CPU build from npm) as the CPU speed peer of `dflash bench`, same file and machine.
//   node llama_bench.mjs MODEL.gguf PROMPT_LEN GEN_LEN THREADS
// Prefill: one batch of PROMPT_LEN pseudo-random ids (the same generator as dflash bench). Decode:
// GEN_LEN greedy single-token steps. Prints JSON {prefill_tok_s, ttft_ms, decode_tok_s}. Settings are
// llama.cpp's defaults for speed (F16 KV cache, flash attention auto), not the oracle settings.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, promptLen, genLen, threads] = process.argv.slice(2);
const P = Number(promptLen), G = Number(genLen), T = Number(threads);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const t = model.fileInfo.tensorInfo.find((x) => x.name === "token_embd.weight");
const V = BigInt(t.dimensions[1]);
const ids = [];
let x = 88172645463325252n;
const mask = (1n << 64n) - 1n;
for (let i = 0; i < P; i++) {
  x ^= (x << 13n) & mask; x ^= x >> 7n; x ^= (x << 17n) & mask;
  ids.push(Number(x % V));
}
const ctx = await model.createContext({contextSize: P + G + 16, batchSize: P, sequences: 1, threads: T});
const seq = ctx.getSequence();
const t0 = performance.now();
let res = await seq.controlledEvaluate(ids.map((id, i) => i === P - 1 ? [id, {generateNext: {token: true}}] : id));
let tok = res[P - 1].next.token;
const ttft = performance.now() - t0;
const t1 = performance.now();
for (let i = 0; i < G; i++) {
  res = await seq.controlledEvaluate([[tok, {generateNext: {token: true}}]]);
  tok = res[0].next.token;
}
const decode = (performance.now() - t1) / 1000;
process.stdout.write(JSON.stringify({prefill_tok_s: P / (ttft / 1000), ttft_ms: ttft, decode_tok_s: G / decode}) + "\n");
process.exit(0);
