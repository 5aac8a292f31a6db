// dflash inspect on GGUF files, safetensors files and HF directories, and on things that are neither.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "support/process.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using test::shell_quote;

test::CommandResult dflash(const std::string& args) {
  return test::run_command(shell_quote(DFLASH_BIN) + " " + args);
}

TEST(Inspect, GgufJsonListsMetadataAndEveryTensor) {
  const std::string dir = test::scratch_dir();
  auto conv = dflash("convert " + shell_quote(test::fixture_path("models/tiny-qwen3")) + " -o " +
                     shell_quote(dir + "/m.gguf"));
  ASSERT_EQ(conv.exit_code, 0) << conv.err;
  auto r = dflash("inspect --json " + shell_quote(dir + "/m.gguf"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["metadata"]["general.architecture"], "qwen3");
  EXPECT_EQ(j["metadata"]["qwen3.block_count"], 4);
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.tokens"].size(), 512u);
  // 4 layers x 11 tensors + token_embd + output_norm (tied: no output.weight).
  EXPECT_EQ(j["tensor_count"], 46);
  EXPECT_EQ(j["tensors"].size(), 46u);

  auto text = dflash("inspect " + shell_quote(dir + "/m.gguf"));
  ASSERT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find("blk.3.ffn_down.weight"), std::string::npos);
  EXPECT_NE(text.out.find("GGUF v3"), std::string::npos);
}

TEST(Inspect, HfDirectoryShowsTheModelAndTensors) {
  auto r = dflash("inspect " + shell_quote(test::fixture_path("models/tiny-qwen35")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("qwen35: 8 layers (6 gdn + 2 attn)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.layers.0.linear_attn.A_log"), std::string::npos);
  auto j = dflash("inspect --json " + shell_quote(test::fixture_path("models/tiny-qwen35/model.safetensors")));
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_EQ(nlohmann::json::parse(j.out)["format"], "safetensors");
}

TEST(Inspect, MissingAndGarbageFilesAreClearErrors) {
  const std::string dir = test::scratch_dir();
  auto r = dflash("inspect " + shell_quote(dir + "/nope.gguf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no such file"), std::string::npos) << r.err;
  std::ofstream(dir + "/garbage.bin") << "this is not a model file at all";
  r = dflash("inspect " + shell_quote(dir + "/garbage.bin"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(r.err.empty());
  std::ofstream(dir + "/trunc.gguf") << "GGUF\x03\x00";
  r = dflash("inspect " + shell_quote(dir + "/trunc.gguf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dflash
