// dflash run and dflash logits as a user runs them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "formats/safetensors.h"
#include "support/process.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using test::shell_quote;

test::CommandResult dflash(const std::string& args) { return test::run_command(shell_quote(DFLASH_BIN) + " " + args); }

TEST(Logits, WritesEveryPositionAsRawFloatsWithASidecar) {
  const std::string model = test::fixture_path("models/tiny-qwen3");
  auto ref = nlohmann::json::parse(*read_text_file(model + "/reference.json"));
  std::vector<int32_t> prompt = ref["prompts"][2];  // 7 tokens
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string out = test::scratch_dir() + "/l.bin";
  auto r = dflash("logits -m " + shell_quote(model) + " --tokens " + ids + " --all -o " + shell_quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto meta = nlohmann::json::parse(*read_text_file(out + ".json"));
  ASSERT_EQ(meta["shape"], nlohmann::json({7, 512}));
  std::ifstream in(out, std::ios::binary);
  std::vector<float> got(7 * 512);
  in.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size() * 4));
  ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(got.size() * 4));
  auto st = SafetensorsFile::open(model + "/reference.safetensors");
  const auto* t = st->find("logits.2");
  std::vector<float> want(t->n_elements());
  std::memcpy(want.data(), t->data.data(), want.size() * 4);
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  EXPECT_LT(err / scale, 1e-4);
  // The sidecar's top-1 of the last row is the argmax of the last row.
  int best = 0;
  for (int v = 1; v < 512; ++v)
    if (got[6 * 512 + v] > got[6 * 512 + best]) best = v;
  EXPECT_EQ(meta["top5"][6][0]["id"], best);
}

TEST(Logits, BadTokensAreClearErrors) {
  const std::string model = test::fixture_path("models/tiny-qwen3");
  const std::string out = test::scratch_dir() + "/l.bin";
  auto r = dflash("logits -m " + shell_quote(model) + " --tokens 1,x,3 -o " + shell_quote(out));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a token id"), std::string::npos) << r.err;
  r = dflash("logits -m " + shell_quote(model) + " --tokens 1,99999 -o " + shell_quote(out));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("outside the vocabulary"), std::string::npos) << r.err;
}

TEST(Run, SamplingIsDeterministicForASeedAndStatsGoToStderr) {
  const std::string model = test::fixture_path("models/tiny-qwen35");
  const std::string args = "run -m " + shell_quote(model) + " --chat -p 'def main():' -n 12 --temperature 0.9 --top-p 0.95 --seed 42";
  auto a = dflash(args);
  auto b = dflash(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_FALSE(a.out.empty());
  EXPECT_NE(a.err.find("tok/s"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("seed 42"), std::string::npos) << a.err;
  EXPECT_EQ(a.out.find("tok/s"), std::string::npos);  // stdout carries only the text
}

TEST(Run, ImpossibleParametersAreClearErrors) {
  const std::string model = test::fixture_path("models/tiny-qwen3");
  auto r = dflash("run -m " + shell_quote(model) + " -p hi --temperature -1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("temperature"), std::string::npos) << r.err;
  r = dflash("run -m " + shell_quote(model) + " -p hi --top-p 1.5");
  EXPECT_EQ(r.exit_code, 1);
  r = dflash("run -m /nonexistent -p hi");
  EXPECT_EQ(r.exit_code, 1);
  r = dflash("run -m " + shell_quote(model));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("prompt"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

TEST(Run, DeviceFlagIsValidated) {
  const std::string model = test::fixture_path("models/tiny-qwen3");
  auto r = test::run_command(test::shell_quote(DFLASH_BIN) + " run -m " + test::shell_quote(model) +
                             " -p hi -n 2 --device tpu:0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
  r = test::run_command(test::shell_quote(DFLASH_BIN) + " run -m " + test::shell_quote(model) +
                        " -p hi -n 2 --device cuda:x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("device index"), std::string::npos) << r.err;
  r = test::run_command(test::shell_quote(DFLASH_BIN) + " run -m " + test::shell_quote(model) +
                        " -p hi -n 2 --device cpu");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// --kv-type f16 (serve, run, logits, bench): a CPU model runs with it, and its logits stay close to f32's;
// another type is refused with a message naming the flag.
TEST(Run, KvTypeFlag) {
  const std::string model = test::fixture_path("models/tiny-qwen35");
  const std::string q = test::shell_quote(DFLASH_BIN);
  auto r = test::run_command(q + " run -m " + test::shell_quote(model) + " -p hi -n 4 --kv-type f16 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  for (const char* bad : {"--kv-type f8", "--kv-type F16"}) {
    r = test::run_command(q + " run -m " + test::shell_quote(model) + " -p hi -n 2 " + bad);
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find("--kv-type"), std::string::npos) << bad << ": " << r.err;
  }
  const std::string f32 = test::scratch_dir() + "/kv32.bin", f16 = test::scratch_dir() + "/kv16.bin";
  for (const auto& [type, out] : {std::pair{"f32", f32}, std::pair{"f16", f16}}) {
    r = test::run_command(q + " logits -m " + test::shell_quote(model) + " --tokens 5,9,2,7,1,3 --all --kv-type " +
                          type + " -o " + test::shell_quote(out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const auto a = read_text_file(f32), b = read_text_file(f16);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  const auto* x = reinterpret_cast<const float*>(a->data());
  const auto* y = reinterpret_cast<const float*>(b->data());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a->size() / 4; ++i) {
    diff = std::max(diff, std::abs(double(x[i]) - y[i]));
    scale = std::max(scale, std::abs(double(x[i])));
  }
  EXPECT_LT(diff, 4 * std::ldexp(1.0, -11) * std::max(1.0, scale));  // fp16 rounding of K and V (kv_f16_test)
}

}  // namespace
}  // namespace dflash
