// dflash inspect FILE: metadata and tensor table of a GGUF file, a safetensors file or an HF model directory.
#include <cstdio>
#include <cstring>
#include <optional>
#include <map>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "cli/commands.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/model_spec.h"

namespace dflash::cli {
namespace {

struct InspectOptions {
  std::string path;
  bool json = false;
  bool no_tensors = false;
};

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

nlohmann::json value_json(const GgufValue& v) {
  if (auto* s = v.as_string()) return *s;
  if (auto* a = v.as_string_array()) return *a;
  if (auto* n = v.as_nested_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& x : *n) out.push_back(value_json(x));
    return out;
  }
  if (v.is_array()) {
    if (v.array_type() == GgufType::kBool) {
      nlohmann::json out = nlohmann::json::array();
      for (int64_t x : *v.as_int_array()) out.push_back(x != 0);
      return out;
    }
    if (v.array_type() == GgufType::kF32 || v.array_type() == GgufType::kF64) return *v.as_float_array();
    if (v.array_type() == GgufType::kU64) {
      nlohmann::json out = nlohmann::json::array();
      for (int64_t x : *v.as_int_array()) out.push_back(static_cast<uint64_t>(x));
      return out;
    }
    return *v.as_int_array();
  }
  if (auto b = v.as_bool()) return *b;
  if (v.type() == GgufType::kU64) return *v.as_uint();
  if (auto i = v.as_int()) return *i;
  return *v.as_float();
}

int inspect_gguf(const InspectOptions& opt) {
  auto f = GgufFile::open(opt.path);
  if (!f.ok()) return report(f.status());
  uint64_t total = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // type -> (count, bytes)
  for (const auto& t : f->tensors()) {
    total += t.nbytes;
    auto& e = by_type[std::string(dtype_name(t.type))];
    e.first++;
    e.second += t.nbytes;
  }
  if (opt.json) {
    nlohmann::json j;
    j["format"] = "gguf";
    j["version"] = f->version();
    j["alignment"] = f->alignment();
    j["file_bytes"] = f->file_size();
    j["metadata"] = nlohmann::json::object();
    for (const auto& [k, v] : f->metadata()) j["metadata"][k] = value_json(v);
    j["tensors"] = nlohmann::json::array();
    if (!opt.no_tensors)
      for (const auto& t : f->tensors())
        j["tensors"].push_back({{"name", t.name}, {"type", dtype_name(t.type)}, {"shape", t.shape},
                                {"offset", t.offset}, {"bytes", t.nbytes}});
    j["tensor_count"] = f->tensors().size();
    j["tensor_bytes"] = total;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%s: GGUF v%u, %llu bytes, alignment %llu, data at offset %llu\n", opt.path.c_str(), f->version(),
              static_cast<unsigned long long>(f->file_size()), static_cast<unsigned long long>(f->alignment()),
              static_cast<unsigned long long>(f->data_offset()));
  std::printf("\nmetadata (%zu keys):\n", f->metadata().size());
  for (const auto& [k, v] : f->metadata()) std::printf("  %-48s %s\n", k.c_str(), v.summary().c_str());
  std::printf("\ntensors (%zu, %.2f MiB):\n", f->tensors().size(), total / 1048576.0);
  if (!opt.no_tensors) {
    std::printf("  %-48s %-6s %-24s %12s %12s\n", "name", "type", "shape (ggml order)", "offset", "bytes");
    for (const auto& t : f->tensors())
      std::printf("  %-48s %-6s %-24s %12llu %12llu\n", t.name.c_str(), std::string(dtype_name(t.type)).c_str(),
                  shape_string(t.shape).c_str(), static_cast<unsigned long long>(t.offset),
                  static_cast<unsigned long long>(t.nbytes));
  }
  std::printf("\nby type:");
  for (const auto& [type, e] : by_type)
    std::printf(" %s x%llu (%.2f MiB)", type.c_str(), static_cast<unsigned long long>(e.first), e.second / 1048576.0);
  std::printf("\n");
  return 0;
}

// A .safetensors file, an index .json, or an HF directory (config.json summarised when present).
int inspect_safetensors(const InspectOptions& opt) {
  auto m = SafetensorsModel::open(opt.path);
  if (!m.ok()) return report(m.status());
  std::optional<ModelSpec> spec;
  std::string spec_error;
  if (is_directory(opt.path)) {
    auto s = model_spec_from_hf_path(opt.path);
    if (s.ok()) spec = *s;
    else spec_error = s.status().to_string();
  }
  std::vector<std::string> names = m->tensor_names();
  if (opt.json) {
    nlohmann::json j;
    j["format"] = "safetensors";
    j["sharded"] = m->sharded();
    j["files"] = m->files().size();
    if (spec) j["model"] = spec->summary();
    j["tensors"] = nlohmann::json::array();
    if (!opt.no_tensors)
      for (const auto& n : names) {
        const auto* t = m->find(n);
        j["tensors"].push_back({{"name", n}, {"type", safetensors_dtype_name(t->dtype)}, {"shape", t->shape},
                                {"bytes", t->nbytes}});
      }
    j["tensor_count"] = names.size();
    j["tensor_bytes"] = m->total_bytes();
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%s: safetensors, %zu file(s)%s, %zu tensors, %.2f MiB\n", opt.path.c_str(), m->files().size(),
              m->sharded() ? " (sharded)" : "", names.size(), m->total_bytes() / 1048576.0);
  if (spec) std::printf("model: %s\n", spec->summary().c_str());
  else if (!spec_error.empty()) std::printf("model: config.json not understood (%s)\n", spec_error.c_str());
  if (!opt.no_tensors) {
    std::printf("\n  %-64s %-5s %-24s %12s\n", "name", "type", "shape (row-major)", "bytes");
    for (const auto& n : names) {
      const auto* t = m->find(n);
      std::printf("  %-64s %-5s %-24s %12llu\n", n.c_str(), std::string(safetensors_dtype_name(t->dtype)).c_str(),
                  shape_string(t->shape).c_str(), static_cast<unsigned long long>(t->nbytes));
    }
  }
  return 0;
}

bool looks_like_gguf(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char magic[4] = {};
  size_t n = std::fread(magic, 1, 4, f);
  std::fclose(f);
  return n == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect", "Print the metadata and tensor table of a model file");
  cmd->add_option("file", opt->path, "GGUF file, .safetensors file, or HF model directory")->required();
  cmd->add_flag("--json", opt->json, "Machine-readable output");
  cmd->add_flag("--no-tensors", opt->no_tensors, "Omit the per-tensor table");
  cmd->callback([opt, &exit_code] {
    if (!is_directory(opt->path) && !file_exists(opt->path))
      exit_code = report(not_found("no such file or directory: '{}'", opt->path));
    else if (is_directory(opt->path) || !looks_like_gguf(opt->path))
      exit_code = inspect_safetensors(*opt);
    else
      exit_code = inspect_gguf(*opt);
  });
}

}  // namespace dflash::cli
