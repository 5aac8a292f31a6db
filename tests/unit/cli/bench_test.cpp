// dflash bench: the report's fields, and random models of a shape that load and run.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "decode/runner.h"
#include "model/random_model.h"
#include "model/weights.h"
#include "state/sequence_state.h"
#include "support/process.h"
#include "support/random_hf_model.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using test::shell_quote;

TEST(Bench, ReportsSpeedBesideTheBandwidthCeiling) {
  auto r = test::run_command(shell_quote(DFLASH_BIN) + " bench -m " +
                             shell_quote(test::fixture_path("models/tiny-qwen35")) +
                             " --prompt-len 70 --gen-len 4 -t 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"prefill_tok_s", "decode_tok_s", "ttft_ms", "decode_ceiling_tok_s", "host_bandwidth_gb_s",
                        "decode_bytes_per_token", "peak_rss_mib"})
    EXPECT_GT(j[k].get<double>(), 0.0) << k;
  EXPECT_NEAR(j["decode_ratio"].get<double>(),
              j["decode_tok_s"].get<double>() / j["decode_ceiling_tok_s"].get<double>(), 1e-9);
}

TEST(Bench, WarmPrefillRunsVerifyCostAndPrefillProfile) {
  auto r = test::run_command(shell_quote(DFLASH_BIN) + " bench -m " +
                             shell_quote(test::fixture_path("models/tiny-qwen35")) +
                             " --prompt-len 40 --gen-len 3 -t 2 --reps 2 --verify-cost 3,5 --profile-prefill --json");
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
  // Every op of the prefill is listed once; the products and the DeltaNet of a qwen35 among them.
  std::set<std::string> ops;
  for (const auto& row : j["prefill_profile"]["ops"]) ops.insert(row["op"].get<std::string>());
  EXPECT_TRUE(ops.count("gated_delta_net")) << j["prefill_profile"].dump();
  EXPECT_TRUE(ops.count("attention")) << j["prefill_profile"].dump();
  r = test::run_command(shell_quote(DFLASH_BIN) + " bench -m " + shell_quote(test::fixture_path("models/tiny-qwen35")) +
                        " --reps 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--reps"), std::string::npos) << r.err;
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

}  // namespace
}  // namespace dflash
