// llama.cpp (prebuilt CPU build from npm) as an oracle for GGUF files dflash writes.
//   node llama_eval.mjs logits MODEL.gguf REQUEST.json OUT.bin
//       REQUEST.json: {"prompts": [[ids...], ...]}; writes every position's logits of every prompt, in order,
//       as little-endian f32 [sum(len), n_vocab]; prints {"n_vocab", "positions"} as JSON on stdout.
//   node llama_eval.mjs tokenize MODEL.gguf TEXTS.json
//       TEXTS.json: ["text", ...]; prints [[ids...], ...] (special tokens parsed) as JSON on stdout.
// Settings follow ../../../shared/reference/llamacpp-oracle.md: F32 KV cache, flash attention off, one
// fresh context per prompt (qwen35 is recurrent).
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [mode, modelPath, inPath, outPath] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});

if (mode === "tokenize") {
  const model = await llama.loadModel({modelPath, vocabOnly: true});
  const texts = JSON.parse(fs.readFileSync(inPath, "utf8"));
  const out = texts.map((t) => Array.from(model.tokenize(t, true)));
  process.stdout.write(JSON.stringify(out));
  process.exit(0);
}

// Vocabulary size as llama.cpp sees it: the rows of token_embd (node-llama-cpp exposes no n_vocab).
function logitsRowLength(model) {
  const t = model.fileInfo.tensorInfo.find((x) => x.name === "token_embd.weight");
  return Number(t.dimensions[1]);
}

if (mode === "logits") {
  const model = await llama.loadModel({modelPath});
  const {prompts} = JSON.parse(fs.readFileSync(inPath, "utf8"));
  const nVocab = logitsRowLength(model);
  const fd = fs.openSync(outPath, "w");
  let positions = 0;
  for (const ids of prompts) {
    const ctx = await model.createContext({contextSize: Math.max(512, ids.length + 16), batchSize: Math.max(512, ids.length),
      sequences: 1, threads: 2, flashAttention: false,
      experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32"});
    const seq = ctx.getSequence();
    const res = await seq.controlledEvaluate(ids.map((t) => [t, {generateNext: {logits: true}}]));
    for (let i = 0; i < ids.length; i++) {
      const row = new Float32Array(nVocab);
      for (const [tok, logit] of res[i].next.logits) row[tok] = logit;
      fs.writeSync(fd, Buffer.from(row.buffer));
    }
    positions += ids.length;
    await ctx.dispose();
  }
  fs.closeSync(fd);
  process.stdout.write(JSON.stringify({n_vocab: nVocab, positions}));
  process.exit(0);
}

console.error(`unknown mode ${mode}`);
process.exit(2);
