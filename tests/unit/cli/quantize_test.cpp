// `dflash quantize` against llama.cpp's own llama_model_quantize on random Qwen3 / Qwen3.5 models:
// same tensor list, same per-tensor types, same bytes; plus the command's error contract.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "formats/gguf.h"
#include "formats/gguf_quantize.h"
#include "support/random_gguf.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

// ---------------------------------------------------------------------------------------------
// llama.cpp's C ABI, as declared in include/llama.h of the llama.cpp release the npm package
// @node-llama-cpp/linux-x64 ships (3.22.1 = llama.cpp release v0.5.0; pinned in
// tests/oracle/package-lock.json). Update these declarations together with that pin.

enum LlamaLogLevel : int32_t {};
using LlamaLogCallback = void (*)(LlamaLogLevel level, const char* text, void* user_data);

struct LlamaModelQuantizeParams {
  int32_t nthread;               // <= 0: std::thread::hardware_concurrency()
  int32_t ftype;                 // enum llama_ftype
  int32_t output_tensor_type;    // enum ggml_type (GGML_TYPE_COUNT: the mix decides)
  int32_t token_embedding_type;  // enum ggml_type
  bool allow_requantize;
  bool quantize_output_tensor;
  bool only_copy;
  bool pure;
  bool keep_split;
  bool dry_run;
  const void* imatrix;       // const struct llama_model_imatrix_data *
  const void* kv_overrides;  // const struct llama_model_kv_override *
  const void* tt_overrides;  // const struct llama_model_tensor_override *
  const int32_t* prune_layers;
  size_t max_buf_size;
};
static_assert(sizeof(LlamaModelQuantizeParams) == 64);

struct LlamaQuantizer {
  LlamaModelQuantizeParams (*default_params)() = nullptr;
  uint32_t (*quantize)(const char* in, const char* out, const LlamaModelQuantizeParams* params) = nullptr;
  void (*log_set)(LlamaLogCallback cb, void* user_data) = nullptr;
};

constexpr const char* kLlamaLib = "@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so";

std::string& llama_log() {
  static std::string log;
  return log;
}

// The library, loaded once; nullptr with *why set when it is not installed or lacks the symbols.
const LlamaQuantizer* llama_quantizer(std::string* why) {
  static LlamaQuantizer q;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string path = test::oracle_path(kLlamaLib);
    if (path.empty()) {
      error = std::string("llama.cpp oracle not installed (tests/oracle/node_modules/") + kLlamaLib +
              "); run npm install in tests/oracle";
      return;
    }
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      error = std::string("cannot load ") + path + ": " + dlerror();
      return;
    }
    q.default_params = reinterpret_cast<decltype(q.default_params)>(dlsym(h, "llama_model_quantize_default_params"));
    q.quantize = reinterpret_cast<decltype(q.quantize)>(dlsym(h, "llama_model_quantize"));
    q.log_set = reinterpret_cast<decltype(q.log_set)>(dlsym(h, "llama_log_set"));
    if (!q.default_params || !q.quantize || !q.log_set) {
      error = path + " lacks llama_model_quantize / llama_model_quantize_default_params / llama_log_set";
      q = {};
      return;
    }
    // Keep llama.cpp's per-tensor chatter for failure messages instead of the test log.
    q.log_set([](LlamaLogLevel, const char* text, void*) { llama_log() += text; }, nullptr);
  });
  if (!q.quantize) {
    if (why) *why = error;
    return nullptr;
  }
  return &q;
}

// Runs llama.cpp's quantizer in this process; "" on success, else its log.
std::string llama_quantize(const LlamaQuantizer& q, const std::string& in, const std::string& out, FileType ftype,
                           bool allow_requantize = false, bool pure = false) {
  LlamaModelQuantizeParams p = q.default_params();
  p.ftype = static_cast<int32_t>(ftype);
  p.nthread = 2;
  p.allow_requantize = allow_requantize;
  p.pure = pure;
  llama_log().clear();
  const uint32_t rc = q.quantize(in.c_str(), out.c_str(), &p);
  return rc == 0 ? std::string() : "llama_model_quantize returned " + std::to_string(rc) + ":\n" + llama_log();
}

// ---------------------------------------------------------------------------------------------
// Running the dflash binary.

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

RunResult run_dflash(const std::string& args, const std::string& dir) {
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  const std::string cmd = quote(DFLASH_BIN) + " " + args + " >" + quote(out) + " 2>" + quote(err);
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

RunResult dflash_quantize(const std::string& in, const std::string& out, FileType ftype, const std::string& dir,
                          const std::string& extra = "") {
  return run_dflash("quantize " + quote(in) + " " + quote(out) + " --type " +
                        std::string(file_type_info(ftype).name) + " --threads 2 " + extra,
                    dir);
}

// ---------------------------------------------------------------------------------------------
// The models: small, but with the features the type rules look at.

struct ModelCase {
  const char* label;
  test::RandomModelSpec spec;
};

std::vector<ModelCase> model_cases() {
  std::vector<ModelCase> cases;
  {
    // Qwen3, 8 layers, every row a multiple of 256, separate output head, f32 weights.
    test::RandomModelSpec s;
    s.arch = "qwen3";
    s.n_layer = 8;
    s.n_embd = 256;
    s.n_ff = 512;
    s.seed = 11;
    cases.push_back({"qwen3_8l_f32", s});
  }
  {
    // Qwen3, 12 layers (blk.10 sorts after blk.9, not after blk.1), tied embeddings, f16 weights, and an
    // FFN width (528) that is not a multiple of 32: ffn_down must fall back to f16.
    test::RandomModelSpec s;
    s.arch = "qwen3";
    s.n_layer = 12;
    s.n_embd = 256;
    s.n_ff = 528;
    s.n_head = 8;
    s.n_head_kv = 2;
    s.head_dim = 32;
    s.tied_embeddings = true;
    s.weight_type = DType::kF16;
    s.seed = 12;
    cases.push_back({"qwen3_12l_tied_f16", s});
  }
  {
    // Qwen3.5 hybrid, 8 layers (6 GatedDeltaNet, 2 gated attention), f16 weights; ssm_out rows (128) and
    // ffn_down rows (544) are multiples of 32 but not 256: k-quants fall back to legacy types.
    test::RandomModelSpec s;
    s.arch = "qwen35";
    s.n_layer = 8;
    s.n_embd = 256;
    s.n_ff = 544;
    s.n_head = 4;
    s.n_head_kv = 1;
    s.head_dim = 64;
    s.weight_type = DType::kF16;
    s.seed = 35;
    cases.push_back({"qwen35_8l_f16", s});
  }
  {
    // Qwen3.5 with a hidden size (288) that is not a multiple of 256: the output/tied embedding rule
    // picks q8_0, and most k-quant tensors fall back. bf16 weights, f32 norms.
    test::RandomModelSpec s;
    s.arch = "qwen35";
    s.n_layer = 6;
    s.n_embd = 288;
    s.n_ff = 768;
    s.n_head = 2;
    s.n_head_kv = 2;
    s.head_dim = 64;
    s.full_attention_interval = 3;
    s.ssm_state_size = 64;
    s.ssm_group_count = 1;
    s.ssm_time_step_rank = 4;
    s.tied_embeddings = true;
    s.weight_type = DType::kBF16;
    s.seed = 36;
    cases.push_back({"qwen35_6l_tied_bf16_n288", s});
  }
  return cases;
}

// ---------------------------------------------------------------------------------------------
// Comparing two GGUF files tensor by tensor.

struct Comparison {
  std::vector<std::string> problems;  // list, order, shape or type differences, metadata differences
  std::vector<std::string> byte_mismatches;
  bool identical_files = false;
};

Comparison compare_gguf(const std::string& ours_path, const std::string& theirs_path) {
  Comparison c;
  auto ours = GgufFile::open(ours_path);
  auto theirs = GgufFile::open(theirs_path);
  if (!ours.ok() || !theirs.ok()) {
    c.problems.push_back("cannot open: " + ours.status().to_string() + " / " + theirs.status().to_string());
    return c;
  }
  if (ours->metadata() != theirs->metadata()) c.problems.push_back("metadata differs");
  const auto& a = ours->tensors();
  const auto& b = theirs->tensors();
  if (a.size() != b.size())
    c.problems.push_back("tensor count " + std::to_string(a.size()) + " vs " + std::to_string(b.size()));
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i].name != b[i].name) {
      c.problems.push_back("tensor #" + std::to_string(i) + ": " + a[i].name + " vs " + b[i].name);
      continue;
    }
    if (a[i].shape != b[i].shape) c.problems.push_back(a[i].name + ": shape differs");
    if (a[i].type != b[i].type) {
      c.problems.push_back(a[i].name + ": type " + std::string(dtype_name(a[i].type)) + " vs " +
                           std::string(dtype_name(b[i].type)));
      continue;
    }
    const auto da = ours->tensor_data(a[i]);
    const auto db = theirs->tensor_data(b[i]);
    if (da.size() != db.size() || !std::equal(da.begin(), da.end(), db.begin()))
      c.byte_mismatches.push_back(a[i].name + " (" + std::string(dtype_name(a[i].type)) + ")");
  }
  c.identical_files = read_file(ours_path) == read_file(theirs_path);
  return c;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "\n  " + x;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Oracle: every file type on every model.

struct OracleCase {
  size_t model;
  FileType ftype;
};

std::vector<OracleCase> oracle_cases() {
  std::vector<OracleCase> v;
  for (size_t m = 0; m < model_cases().size(); ++m)
    for (const auto& ft : file_types()) v.push_back({m, ft.type});
  return v;
}

class QuantizeOracle : public ::testing::TestWithParam<OracleCase> {};

TEST_P(QuantizeOracle, SameTensorsTypesAndBytesAsLlamaCpp) {
  std::string why;
  const LlamaQuantizer* llama = llama_quantizer(&why);
  if (!llama) DF_SKIP_LOUDLY(why);
  const ModelCase model = model_cases()[GetParam().model];
  const FileType ftype = GetParam().ftype;
  const std::string dir = test::scratch_dir();
  const std::string in = dir + "/in.gguf", ours = dir + "/ours.gguf", theirs = dir + "/theirs.gguf";
  ASSERT_EQ(test::write_random_gguf(in, model.spec).to_string(), "ok");

  const RunResult r = dflash_quantize(in, ours, ftype, dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string llama_error = llama_quantize(*llama, in, theirs, ftype);
  ASSERT_EQ(llama_error, "");

  const Comparison c = compare_gguf(ours, theirs);
  EXPECT_TRUE(c.problems.empty()) << model.label << " " << file_type_info(ftype).name << ":" << join(c.problems);
  EXPECT_TRUE(c.byte_mismatches.empty())
      << model.label << " " << file_type_info(ftype).name << ": tensor bytes differ:" << join(c.byte_mismatches);
  // Same metadata, order, alignment and bytes: the whole file is the one llama-quantize writes.
  EXPECT_TRUE(c.identical_files) << model.label << " " << file_type_info(ftype).name;
}

std::string oracle_case_name(const ::testing::TestParamInfo<OracleCase>& info) {
  return std::string(model_cases()[info.param.model].label) + "_" +
         std::string(file_type_info(info.param.ftype).name);
}

INSTANTIATE_TEST_SUITE_P(AllFileTypes, QuantizeOracle, ::testing::ValuesIn(oracle_cases()), oracle_case_name);

TEST(QuantizeOracleRequantize, Q8InputToQ4KMMatchesLlamaCppWithAllowRequantize) {
  std::string why;
  const LlamaQuantizer* llama = llama_quantizer(&why);
  if (!llama) DF_SKIP_LOUDLY(why);
  const std::string dir = test::scratch_dir();
  test::RandomModelSpec spec = model_cases()[2].spec;  // qwen35
  spec.weight_type = DType::kQ8_0;
  const std::string in = dir + "/in.gguf", ours = dir + "/ours.gguf", theirs = dir + "/theirs.gguf";
  ASSERT_EQ(test::write_random_gguf(in, spec).to_string(), "ok");

  const RunResult refused = dflash_quantize(in, ours, FileType::kQ4_K_M, dir);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("--allow-requantize"), std::string::npos) << refused.err;
  EXPECT_FALSE(std::filesystem::exists(ours));

  const RunResult r = dflash_quantize(in, ours, FileType::kQ4_K_M, dir, "--allow-requantize");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(llama_quantize(*llama, in, theirs, FileType::kQ4_K_M, /*allow_requantize=*/true), "");
  const Comparison c = compare_gguf(ours, theirs);
  EXPECT_TRUE(c.problems.empty()) << join(c.problems);
  EXPECT_TRUE(c.byte_mismatches.empty()) << join(c.byte_mismatches);
}

TEST(QuantizeOracleRequantize, PureQ4KMMatchesLlamaCppPure) {
  std::string why;
  const LlamaQuantizer* llama = llama_quantizer(&why);
  if (!llama) DF_SKIP_LOUDLY(why);
  const std::string dir = test::scratch_dir();
  const std::string in = dir + "/in.gguf", ours = dir + "/ours.gguf", theirs = dir + "/theirs.gguf";
  ASSERT_EQ(test::write_random_gguf(in, model_cases()[2].spec).to_string(), "ok");
  const RunResult r = dflash_quantize(in, ours, FileType::kQ4_K_M, dir, "--pure");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(llama_quantize(*llama, in, theirs, FileType::kQ4_K_M, false, /*pure=*/true), "");
  const Comparison c = compare_gguf(ours, theirs);
  EXPECT_TRUE(c.problems.empty()) << join(c.problems);
  EXPECT_TRUE(c.byte_mismatches.empty()) << join(c.byte_mismatches);
  EXPECT_TRUE(c.identical_files);
}

// ---------------------------------------------------------------------------------------------
// The plan without the oracle: the qwen35 facts llama.cpp's rules produce, pinned.

TEST(QuantizePlan, Qwen35Q4KMKeepsSmallTensorsAndBumpsTheVSchedule) {
  const std::string dir = test::scratch_dir();
  test::RandomModelSpec spec = model_cases()[2].spec;  // qwen35, 8 layers, n_ff 544
  ASSERT_EQ(test::write_random_gguf(dir + "/in.gguf", spec).to_string(), "ok");
  auto file = GgufFile::open(dir + "/in.gguf");
  ASSERT_TRUE(file.ok());
  auto plan = plan_quantization(*file, QuantOptions{FileType::kQ4_K_M});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  std::map<std::string, DType> to;
  for (const auto& q : plan->tensors) to[q.name] = q.to;

  // Never quantized: 1-D tensors, norms, the conv kernel.
  EXPECT_EQ(to["blk.0.ssm_conv1d.weight"], DType::kF16);
  EXPECT_EQ(to["blk.0.ssm_a"], DType::kF32);
  EXPECT_EQ(to["blk.0.ssm_dt.bias"], DType::kF32);
  EXPECT_EQ(to["blk.0.ssm_norm.weight"], DType::kF32);
  EXPECT_EQ(to["blk.3.attn_q_norm.weight"], DType::kF32);
  EXPECT_EQ(to["output_norm.weight"], DType::kF32);
  // The head: q6_K. The token embedding (not tied here): the default type.
  EXPECT_EQ(to["output.weight"], DType::kQ6_K);
  EXPECT_EQ(to["token_embd.weight"], DType::kQ4_K);
  // attn_qkv (GatedDeltaNet) and attn_v (attention) share the V schedule: 8 of them, layers 0..7 in
  // order; use_more_bits(i, 8) holds for i = 0, 3, 6, 7.
  EXPECT_EQ(to["blk.0.attn_qkv.weight"], DType::kQ6_K);
  EXPECT_EQ(to["blk.1.attn_qkv.weight"], DType::kQ4_K);
  EXPECT_EQ(to["blk.3.attn_v.weight"], DType::kQ6_K);
  EXPECT_EQ(to["blk.6.attn_qkv.weight"], DType::kQ6_K);
  EXPECT_EQ(to["blk.7.attn_v.weight"], DType::kQ6_K);
  // Other GatedDeltaNet projections take the default type; rows of 128 (ssm_out) fall back to q5_0.
  EXPECT_EQ(to["blk.0.attn_gate.weight"], DType::kQ4_K);
  EXPECT_EQ(to["blk.0.ssm_alpha.weight"], DType::kQ4_K);
  EXPECT_EQ(to["blk.0.ssm_beta.weight"], DType::kQ4_K);
  EXPECT_EQ(to["blk.0.ssm_out.weight"], DType::kQ5_0);
  // ffn_down: q6_K on the use_more_bits layers, then the 544-wide rows force q8_0 / q5_0.
  EXPECT_EQ(to["blk.0.ffn_down.weight"], DType::kQ8_0);
  EXPECT_EQ(to["blk.1.ffn_down.weight"], DType::kQ5_0);
  EXPECT_GT(plan->n_fallback, 0);
  // Output order: non-layer tensors by name, then layers by number.
  EXPECT_EQ(plan->tensors.front().name, "output.weight");
  EXPECT_TRUE(plan->tensors.back().name.starts_with("blk.7."));
}

TEST(QuantizePlan, FileTypeNamesAreCaseInsensitive) {
  EXPECT_EQ(file_type_from_name("Q4_K_M"), FileType::kQ4_K_M);
  EXPECT_EQ(file_type_from_name("q8_0"), FileType::kQ8_0);
  EXPECT_EQ(file_type_from_name("BF16"), FileType::kBF16);
  EXPECT_EQ(file_type_from_name("all_f32"), FileType::kAllF32);
  EXPECT_FALSE(file_type_from_name("q4_k").has_value());
  EXPECT_FALSE(file_type_from_name("iq2_xxs").has_value());
}

// ---------------------------------------------------------------------------------------------
// The command's contract.

class QuantizeCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratch_dir();
    in_ = dir_ + "/in.gguf";
    test::RandomModelSpec spec;
    spec.n_layer = 2;
    ASSERT_EQ(test::write_random_gguf(in_, spec).to_string(), "ok");
  }
  std::string dir_, in_;
};

TEST_F(QuantizeCommand, WritesAQuantizedFileWithFileTypeMetadata) {
  const RunResult r = dflash_quantize(in_, dir_ + "/out.gguf", FileType::kQ4_K_M, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("blk.0.attn_q.weight"), std::string::npos) << "progress goes to stderr";
  auto out = GgufFile::open(dir_ + "/out.gguf");
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->get_int("general.file_type")->value_or(-1), 15);
  EXPECT_EQ(out->get_int("general.quantization_version")->value_or(-1), 2);
  EXPECT_EQ(out->get_string("general.architecture")->value_or(""), "qwen3");
  EXPECT_EQ(out->find_tensor("blk.0.attn_q.weight")->type, DType::kQ4_K);
  EXPECT_EQ(out->find_tensor("blk.0.attn_norm.weight")->type, DType::kF32);
}

TEST_F(QuantizeCommand, DryRunPrintsThePlanAndWritesNothing) {
  const RunResult r = run_dflash("quantize " + quote(in_) + " " + quote(dir_ + "/out.gguf") + " --type q6_k --dry-run",
                                 dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("blk.1.ffn_down.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("q6_K"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quant size"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out.gguf"));
  // The output path is optional with --dry-run.
  EXPECT_EQ(run_dflash("quantize " + quote(in_) + " --type q8_0 --dry-run", dir_).exit_code, 0);
}

TEST_F(QuantizeCommand, UnknownTypeIsAClearError) {
  const RunResult r = run_dflash("quantize " + quote(in_) + " " + quote(dir_ + "/out.gguf") + " --type q4_k_xl", dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown --type 'q4_k_xl'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("q4_k_m"), std::string::npos) << "lists the valid types: " << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out.gguf"));
}

TEST_F(QuantizeCommand, MissingInputIsAClearError) {
  const RunResult r = dflash_quantize(dir_ + "/nope.gguf", dir_ + "/out.gguf", FileType::kQ8_0, dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nope.gguf"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out.gguf"));
}

TEST_F(QuantizeCommand, NonGgufInputIsAClearError) {
  std::ofstream(dir_ + "/model.safetensors") << "this is not a gguf file at all, just some text";
  const RunResult r = dflash_quantize(dir_ + "/model.safetensors", dir_ + "/out.gguf", FileType::kQ8_0, dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("dflash: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out.gguf"));
}

TEST_F(QuantizeCommand, OutputInAMissingDirectoryIsAClearError) {
  const RunResult r = dflash_quantize(in_, dir_ + "/no/such/dir/out.gguf", FileType::kQ8_0, dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no/such/dir"), std::string::npos) << r.err;
}

TEST_F(QuantizeCommand, RefusesToOverwriteItsInput) {
  const RunResult r = dflash_quantize(in_, in_, FileType::kQ8_0, dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
  EXPECT_TRUE(GgufFile::open(in_).ok());
}

}  // namespace
}  // namespace dflash
