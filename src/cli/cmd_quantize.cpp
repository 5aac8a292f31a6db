// dflash quantize IN.gguf OUT.gguf --type T: llama.cpp's per-tensor quantization mix, tensor by tensor.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "base/file_io.h"
#include "cli/commands.h"
#include "formats/gguf_quantize.h"

namespace dflash::cli {
namespace {

struct QuantizeOptions {
  std::string in_path;
  std::string out_path;
  std::string type;
  int threads = 0;
  bool dry_run = false;
  bool allow_requantize = false;
  bool pure = false;
};

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? " x " : "") + std::to_string(shape[i]);
  return s;
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }
double bits_per_weight(uint64_t bytes, uint64_t n) { return n == 0 ? 0.0 : 8.0 * static_cast<double>(bytes) / n; }

void print_plan(const QuantPlan& plan) {
  std::printf("%-44s %-22s %-6s    %-6s %12s %12s\n", "tensor", "shape", "from", "to", "MiB in", "MiB out");
  for (const auto& q : plan.tensors)
    std::printf("%-44s %-22s %-6s -> %-6s %12.3f %12.3f%s\n", q.name.c_str(), shape_string(q.shape).c_str(),
                std::string(dtype_name(q.from)).c_str(), std::string(dtype_name(q.to)).c_str(), mib(q.bytes_in),
                mib(q.bytes_out), q.fallback ? "  (row length fallback)" : "");
  std::map<std::string, std::pair<int, uint64_t>> by_type;
  for (const auto& q : plan.tensors) {
    auto& e = by_type[std::string(dtype_name(q.to))];
    e.first++;
    e.second += q.bytes_out;
  }
  std::printf("\nby type:");
  for (const auto& [t, e] : by_type) std::printf(" %s x%d (%.2f MiB)", t.c_str(), e.first, mib(e.second));
  std::printf("\n");
}

void print_totals(FILE* out, const QuantPlan& plan) {
  std::fprintf(out, "model size: %10.2f MiB (%.2f bits per weight)\n", mib(plan.bytes_in),
               bits_per_weight(plan.bytes_in, plan.n_elements));
  std::fprintf(out, "quant size: %10.2f MiB (%.2f bits per weight), %s\n", mib(plan.bytes_out),
               bits_per_weight(plan.bytes_out, plan.n_elements),
               std::string(file_type_info(plan.file_type).name).c_str());
  if (plan.n_fallback > 0)
    std::fprintf(out, "%d of %zu tensors took a fallback type (rows not a multiple of the block size)\n",
                 plan.n_fallback, plan.tensors.size());
}

// Fails early, before any work, on an output path that cannot be written.
Status check_output_path(const std::string& in_path, const std::string& out_path) {
  namespace fs = std::filesystem;
  const fs::path out(out_path);
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!is_directory(dir.string())) return not_found("output directory '{}' does not exist", dir.string());
  if (is_directory(out_path)) return invalid_argument("output '{}' is a directory", out_path);
  std::error_code ec;
  if (fs::exists(out, ec) && fs::equivalent(fs::path(in_path), out, ec))
    return invalid_argument("output '{}' is the input file; write to a new file", out_path);
  return Status();
}

int run_quantize(const QuantizeOptions& opt) {
  auto ftype = file_type_from_name(opt.type);
  if (!ftype)
    return report(invalid_argument("unknown --type '{}'; expected one of: {}", opt.type, file_type_names()));
  if (!opt.dry_run) {
    if (opt.out_path.empty()) return report(invalid_argument("OUT.gguf is required unless --dry-run is given"));
    if (Status st = check_output_path(opt.in_path, opt.out_path); !st.ok()) return report(st);
  }
  auto in = GgufFile::open(opt.in_path);
  if (!in.ok()) return report(in.status());
  QuantOptions qopt;
  qopt.file_type = *ftype;
  qopt.allow_requantize = opt.allow_requantize;
  qopt.pure = opt.pure;
  auto plan = plan_quantization(*in, qopt);
  if (!plan.ok()) return report(plan.status().with_context(opt.in_path + ": "));

  if (opt.dry_run) {
    print_plan(*plan);
    print_totals(stdout, *plan);
    return 0;
  }

  const auto start = std::chrono::steady_clock::now();
  auto progress = [](const TensorQuant& q, size_t i, size_t n) {
    if (q.converts())
      std::fprintf(stderr, "[%4zu/%4zu] %-44s %-22s %6s -> %-6s %10.2f MiB -> %10.2f MiB\n", i + 1, n,
                   q.name.c_str(), shape_string(q.shape).c_str(), std::string(dtype_name(q.from)).c_str(),
                   std::string(dtype_name(q.to)).c_str(), mib(q.bytes_in), mib(q.bytes_out));
    else
      std::fprintf(stderr, "[%4zu/%4zu] %-44s %-22s %6s (copied)  %10.2f MiB\n", i + 1, n, q.name.c_str(),
                   shape_string(q.shape).c_str(), std::string(dtype_name(q.from)).c_str(), mib(q.bytes_in));
  };
  Status st = write_quantized_gguf(*in, *plan, opt.out_path, opt.threads, progress);
  if (!st.ok()) return report(st.with_context(opt.out_path + ": "));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  print_totals(stderr, *plan);
  std::fprintf(stderr, "wrote %s in %.1f s\n", opt.out_path.c_str(), secs);
  return 0;
}

}  // namespace

void add_quantize_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<QuantizeOptions>();
  auto* cmd = app.add_subcommand(
      "quantize", "Quantize a GGUF model with llama.cpp's per-tensor type mix (same types as llama-quantize)");
  cmd->add_option("input", opt->in_path, "Input GGUF (f32/f16/bf16 weights)")->required();
  cmd->add_option("output", opt->out_path, "Output GGUF (written atomically)");
  cmd->add_option("--type,-t", opt->type, "File type: " + file_type_names())->required();
  cmd->add_option("--threads", opt->threads, "Worker threads (0: one per hardware thread)")->capture_default_str();
  cmd->add_flag("--dry-run", opt->dry_run, "Print the per-tensor plan and the resulting size; write nothing");
  cmd->add_flag("--allow-requantize", opt->allow_requantize,
                "Allow inputs whose tensors are already block-quantized (loses quality)");
  cmd->add_flag("--pure", opt->pure, "Give every quantizable tensor the default type (no k-quant mix)");
  cmd->callback([opt, &exit_code] { exit_code = run_quantize(*opt); });
}

}  // namespace dflash::cli
