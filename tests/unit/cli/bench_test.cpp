// dflash bench: the report's fields, and random models of a shape that load and run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "decode/runner.h"
#include "formats/gguf.h"
#include "model/random_model.h"
#include "model/weights.h"
#include "state/sequence_state.h"
#include "support/process.h"
#include "support/random_hf_model.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using test::shell_quote;

// `dflash bench` on the tiny qwen35 fixture with these arguments.
test::CommandResult bench_tiny(const std::string& args) {
  return test::run_command(shell_quote(DFLASH_BIN) + " bench -m " +
                           shell_quote(test::fixture_path("models/tiny-qwen35")) + " " + args);
}

TEST(Bench, ReportsSpeedBesideTheBandwidthCeiling) {
  auto r = bench_tiny("--prompt-len 70 --gen-len 4 -t 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"prefill_tok_s", "decode_tok_s", "decode_first_step_ms", "ttft_ms", "decode_ceiling_tok_s",
                        "host_bandwidth_gb_s", "decode_bytes_per_token", "peak_rss_mib"})
    EXPECT_GT(j[k].get<double>(), 0.0) << k;
  EXPECT_NEAR(j["decode_ratio"].get<double>(),
              j["decode_tok_s"].get<double>() / j["decode_ceiling_tok_s"].get<double>(), 1e-9);
}

TEST(Bench, WarmPrefillRunsVerifyCostAndPrefillProfile) {
  auto r = bench_tiny("--prompt-len 40 --gen-len 3 -t 2 --reps 2 --verify-cost 3,5 --profile-prefill --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prefill_reps"].get<int>(), 2);
  EXPECT_GT(j["prefill_cold_tok_s"].get<double>(), 0.0);
  EXPECT_GT(j["prefill_tflop"].get<double>(), 0.0);
  EXPECT_TRUE(j["prefill_ceiling_tok_s"].is_null());  // no tensor-core rate on the CPU
  ASSERT_EQ(j["verify_cost"].size(), 2u);
  EXPECT_EQ(j["verify_cost"][1]["tokens"].get<int>(), 5);
  EXPECT_GT(j["verify_cost"][1]["verify_ms"].get<double>(), 0.0);
  EXPECT_NEAR(j["verify_cost"][1]["ratio"].get<double>(),
              j["verify_cost"][1]["verify_ms"].get<double>() / j["verify_cost"][1]["plain_ms"].get<double>(), 1e-9);
  EXPECT_EQ(j["verify_cost"][1]["shape"].get<std::string>(), "chain");
  EXPECT_EQ(j["verify_cost"][1]["depth"].get<int>(), 4);
  // Every op of the prefill is listed once; the products and the DeltaNet of a qwen35 among them.
  std::set<std::string> ops;
  for (const auto& row : j["prefill_profile"]["ops"]) ops.insert(row["op"].get<std::string>());
  EXPECT_TRUE(ops.count("gated_delta_net")) << j["prefill_profile"].dump();
  EXPECT_TRUE(ops.count("attention")) << j["prefill_profile"].dump();
  r = bench_tiny("--reps 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--reps"), std::string::npos) << r.err;
}

// --verify-tree: DDTree-shaped verify steps (tree mask, per-node DeltaNet states, the root committed), on a model
// with both attention and DeltaNet layers; the spine-and-leaf shape is 2 deep at 5 nodes, 11 at 23.
TEST(Bench, TreeShapedVerifyCost) {
  auto r = bench_tiny("--prompt-len 40 --gen-len 3 -t 2 --reps 1 --verify-cost 5,23 --verify-tree --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["verify_cost"].size(), 2u);
  for (const auto& row : j["verify_cost"]) {
    EXPECT_EQ(row["shape"].get<std::string>(), "tree");
    EXPECT_GT(row["verify_ms"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["verify_cost"][0]["depth"].get<int>(), 2);
  EXPECT_EQ(j["verify_cost"][1]["depth"].get<int>(), 11);
  r = bench_tiny("--verify-tree");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--verify-tree needs --verify-cost"), std::string::npos) << r.err;
}

TEST(Bench, UnknownShapesAndMissingArgumentsAreClearErrors) {
  auto r = test::run_command(shell_quote(DFLASH_BIN) + " bench --make-random qwen9-1t -o /tmp/x.gguf");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("qwen3.5-27b"), std::string::npos) << r.err;  // lists the known shapes
  r = test::run_command(shell_quote(DFLASH_BIN) + " bench");
  EXPECT_EQ(r.exit_code, 1);
  r = test::run_command(shell_quote(DFLASH_BIN) + " bench -m " + shell_quote(test::fixture_path("models/tiny-qwen3")) +
                        " --prompt-len 0");
  EXPECT_EQ(r.exit_code, 1);
}

TEST(RandomModel, WritesLlamaCppsTypeMixAndRunsInTheEngine) {
  auto spec = model_spec_from_hf_config(test::tiny_qwen35_config(512));
  ASSERT_TRUE(spec.ok());
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::string("none"));
  ASSERT_TRUE(add_random_model(*spec, FileType::kQ8_0, 5, 2, w).ok());
  const std::string path = test::scratch_dir() + "/r.gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->find_tensor("blk.0.ffn_up.weight")->type, DType::kQ8_0);
  EXPECT_EQ(file->find_tensor("blk.0.attn_norm.weight")->type, DType::kF32);
  EXPECT_EQ(file->find_tensor("blk.0.ssm_conv1d.weight")->type, DType::kF32);
  auto weights = Weights::load(path, 2);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  EXPECT_EQ(weights->spec().n_layers, 8);
  Runner runner(*weights, 2);
  SequenceState state(weights->spec(), runner.backend());
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  auto logits = runner.prefill(state, prompt);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  for (float x : *logits) ASSERT_TRUE(std::isfinite(x));
  for (auto name : random_model_presets()) EXPECT_TRUE(random_model_spec(name).ok()) << name;
}

// --distinct-rows: a tensor of more rows repeats its first N (the same bytes the full file has there), the
// rest of the file is unchanged, and the model still runs.
TEST(RandomModel, DistinctRowsRepeatTheFirstRowsOfTheFullFile) {
  auto spec = model_spec_from_hf_config(test::tiny_qwen35_config(512));
  ASSERT_TRUE(spec.ok());
  const std::string full_path = test::scratch_dir() + "/full.gguf", few_path = test::scratch_dir() + "/few.gguf";
  for (const auto& [path, distinct] : {std::pair{full_path, int64_t{0}}, std::pair{few_path, int64_t{3}}}) {
    GgufWriter w;
    w.set("tokenizer.ggml.model", GgufValue::string("none"));
    ASSERT_TRUE(add_random_model(*spec, FileType::kQ8_0, 5, 2, w, distinct).ok());
    ASSERT_TRUE(w.write(path).ok());
  }
  auto full = GgufFile::open(full_path);
  auto few = GgufFile::open(few_path);
  ASSERT_TRUE(full.ok() && few.ok());
  int repeated = 0;
  for (const GgufTensorInfo& t : full->tensors()) {
    const GgufTensorInfo* u = few->find_tensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    ASSERT_EQ(u->type, t.type);
    ASSERT_EQ(u->nbytes, t.nbytes);
    const auto a = full->tensor_data(t), b = few->tensor_data(*u);
    int64_t rows = 1;
    for (size_t d = 1; d < t.shape.size(); ++d) rows *= static_cast<int64_t>(t.shape[d]);
    const size_t row = t.nbytes / static_cast<size_t>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const size_t from = static_cast<size_t>(r % 3) * row;  // the full file's row r % 3
      ASSERT_EQ(std::memcmp(b.data() + static_cast<size_t>(r) * row, a.data() + (rows > 3 ? from : r * row), row), 0)
          << t.name << " row " << r;
    }
    repeated += rows > 3;
  }
  EXPECT_GT(repeated, 10);
  auto weights = Weights::load(few_path, 2);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  Runner runner(*weights, 2);
  SequenceState state(weights->spec(), runner.backend());
  std::vector<int32_t> prompt = {1, 2, 3};
  ASSERT_TRUE(runner.prefill(state, prompt).ok());
  auto r = test::run_command(shell_quote(DFLASH_BIN) + " bench --make-random qwen3-0.6b --distinct-rows -1 -o " +
                             shell_quote(test::scratch_dir() + "/neg.gguf"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--distinct-rows"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dflash
