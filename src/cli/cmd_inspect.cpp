// dflash inspect FILE: metadata and tensor table of a GGUF file, a safetensors file or an HF model directory.
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "cli/commands.h"
#include "formats/gguf.h"

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

}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect", "Print the metadata and tensor table of a model file");
  cmd->add_option("file", opt->path, "GGUF file")->required();
  cmd->add_flag("--json", opt->json, "Machine-readable output");
  cmd->add_flag("--no-tensors", opt->no_tensors, "Omit the per-tensor table");
  cmd->callback([opt, &exit_code] { exit_code = inspect_gguf(*opt); });
}

}  // namespace dflash::cli
