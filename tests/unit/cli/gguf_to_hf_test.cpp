// tools/train/gguf_to_hf.py (how the draft trainer reads a served GGUF): the HF directory it writes loads in
// dflash with the GGUF's logits and tokenization. dflash reads that directory through its HF path (names,
// zero-centred norms, A_log, the DeltaNet V-head order, conv1d's shape) and the GGUF through its GGUF path,
// so equal logits mean every tensor was taken back through each of those steps correctly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/process.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using test::run_command;
using test::shell_quote;

test::CommandResult dflash(const std::string& args) { return run_command(shell_quote(DFLASH_BIN) + " " + args); }

// A Python 3 that has numpy (scripts/setup-debian.sh installs python3-numpy), or "".
std::string python_with_numpy() {
  for (const char* py : {"python3", "/usr/bin/python3"})
    if (run_command(std::string(py) + " -c 'import numpy'").exit_code == 0) return py;
  return "";
}

std::vector<float> read_floats(const std::string& path) {
  const std::vector<uint8_t> bytes = test::read_bytes(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// Writes the HF directory of `gguf` under `dir`, then compares dflash's tokens of `text` and logits of every
// position between the two. Logits may differ by the rounding of the weights' two paths into the products.
void check_round_trip(const std::string& gguf, const std::string& dir, const std::string& text, float rel_tol) {
  const std::string py = python_with_numpy();
  ASSERT_FALSE(py.empty()) << "no python3 with numpy (scripts/setup-debian.sh installs python3-numpy)";
  const std::string hf = dir + "/hf";
  auto conv = run_command(py + " " + shell_quote(test::source_dir() + "/tools/train/gguf_to_hf.py") + " " +
                          shell_quote(gguf) + " -o " + shell_quote(hf));
  ASSERT_EQ(conv.exit_code, 0) << conv.err;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(std::filesystem::exists(hf + "/" + f)) << f;

  auto ids = dflash("tokenize -m " + shell_quote(gguf) + " --special -t " + shell_quote(text));
  auto ids_hf = dflash("tokenize -m " + shell_quote(hf + "/tokenizer.json") + " --special -t " + shell_quote(text));
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  ASSERT_EQ(ids_hf.exit_code, 0) << ids_hf.err;
  EXPECT_EQ(ids.out, ids_hf.out);
  std::string tokens = ids.out;
  std::erase_if(tokens, [](char c) { return c == '[' || c == ']' || c == ' ' || c == '\n'; });
  ASSERT_FALSE(tokens.empty());

  auto a = dflash("logits -m " + shell_quote(gguf) + " --tokens " + tokens + " --all --threads 2 -o " +
                  shell_quote(dir + "/gguf.f32"));
  auto b = dflash("logits -m " + shell_quote(hf) + " --tokens " + tokens + " --all --threads 2 -o " +
                  shell_quote(dir + "/hf.f32"));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const std::vector<float> la = read_floats(dir + "/gguf.f32"), lb = read_floats(dir + "/hf.f32");
  ASSERT_EQ(la.size(), lb.size());
  ASSERT_FALSE(la.empty());
  float scale = 0.0f, diff = 0.0f;
  for (size_t i = 0; i < la.size(); ++i) {
    ASSERT_TRUE(std::isfinite(la[i]) && std::isfinite(lb[i])) << i;
    scale = std::max(scale, std::fabs(la[i]));
    diff = std::max(diff, std::fabs(la[i] - lb[i]));
  }
  EXPECT_LE(diff, rel_tol * std::max(1.0f, scale)) << "max |logit| " << scale;
}

// A tiny Qwen3.5 (untied head, 2 K-heads / 4 V-heads: the V-head order matters) converted to f32 and to q8_0.
TEST(GgufToHf, TinyQwen35RoundTrips) {
  for (const char* type : {"f32", "q8_0"}) {
    SCOPED_TRACE(type);
    const std::string dir = test::scratch_dir() + "/" + type;
    std::filesystem::create_directories(dir);
    const std::string gguf = dir + "/tiny.gguf";
    auto conv = dflash("convert " + shell_quote(test::fixture_path("models/tiny-qwen35")) + " -o " +
                       shell_quote(gguf) + " --type " + type);
    ASSERT_EQ(conv.exit_code, 0) << conv.err;
    check_round_trip(gguf, dir, "<|im_start|>user\ndef add(a, b):\n    return a + b<|im_end|>\n", 1e-4f);
  }
}

// The bundled model, as its draft was trained against it (tied head, Q8_0, the Qwen3.5 chat template).
TEST(GgufToHf, BundledModelRoundTrips) {
  check_round_trip(test::source_dir() + "/models/default-coder-19m-q8_0.gguf", test::scratch_dir(),
                   "<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\n\n</think>\n\n```python\ndef reverse(xs):\n    return xs[::-1]",
                   1e-4f);
}

// A file that is not a Qwen3.5 GGUF is refused with a message, not a traceback.
TEST(GgufToHf, RefusesWhatItCannotWrite) {
  const std::string py = python_with_numpy();
  ASSERT_FALSE(py.empty()) << "no python3 with numpy (scripts/setup-debian.sh installs python3-numpy)";
  const std::string dir = test::scratch_dir();
  std::ofstream(dir + "/junk.gguf") << "not a gguf at all";
  const std::string tool = shell_quote(test::source_dir() + "/tools/train/gguf_to_hf.py");
  auto r = run_command(py + " " + tool + " " + shell_quote(dir + "/junk.gguf") + " -o " + shell_quote(dir + "/out"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("not a GGUF file"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("Traceback"), std::string::npos) << r.err;
  const std::string qwen3 = dir + "/qwen3.gguf";
  ASSERT_EQ(dflash("convert " + shell_quote(test::fixture_path("models/tiny-qwen3")) + " -o " + shell_quote(qwen3))
                .exit_code,
            0);
  r = run_command(py + " " + tool + " " + shell_quote(qwen3) + " -o " + shell_quote(dir + "/out"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("Qwen3.5 (qwen35) models only"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("Traceback"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dflash
