#include "placement/target_placement.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>

namespace dflash {
namespace {

std::vector<std::string_view> split_commas(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    std::string_view item = s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    out.push_back(item);
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

Status check_device(std::string_view d) {
  if (d == "cpu") return Status();
  if (d.rfind("cuda:", 0) == 0) {
    const std::string_view num = d.substr(5);
    int index = -1;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (!num.empty() && ec == std::errc() && p == num.data() + num.size() && index >= 0) return Status();
  }
  return invalid_argument("--target-devices: '{}' is not 'cpu' or 'cuda:N'", d);
}

}  // namespace

Result<std::vector<int64_t>> split_layer_ends(const std::vector<double>& weights, int64_t n_layers) {
  double total = 0;
  for (double w : weights) total += w;
  std::vector<int64_t> ends;
  double acc = 0;
  int64_t prev = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    acc += weights[i];
    const int64_t end = i + 1 == weights.size() ? n_layers : std::llround(acc / total * static_cast<double>(n_layers));
    if (end <= prev)
      return invalid_argument("--target-layer-split: shard {} would get no layer of {} (weights too uneven)", i,
                              n_layers);
    ends.push_back(end);
    prev = end;
  }
  return ends;
}

Result<std::vector<ShardPlan>> plan_target_split(std::string_view devices, std::string_view weights,
                                                 int64_t n_layers) {
  if (devices.empty()) {
    if (!weights.empty()) return invalid_argument("--target-layer-split needs --target-devices");
    return invalid_argument("--target-devices is empty");
  }
  const std::vector<std::string_view> devs = split_commas(devices);
  std::set<std::string_view> gpus;
  for (std::string_view d : devs) {
    if (d.empty()) return invalid_argument("--target-devices '{}' has an empty entry", devices);
    DF_RETURN_IF_ERROR(check_device(d));
    if (d != "cpu" && !gpus.insert(d).second)
      return invalid_argument("--target-devices names {} twice (a GPU holds one shard)", d);
  }
  std::vector<double> w(devs.size(), 1.0);
  if (!weights.empty()) {
    const std::vector<std::string_view> ws = split_commas(weights);
    if (ws.size() != devs.size())
      return invalid_argument("--target-layer-split has {} weights for {} devices (one positive weight per device)",
                              ws.size(), devs.size());
    for (size_t i = 0; i < ws.size(); ++i) {
      const std::string item(ws[i]);
      char* end = nullptr;
      const double v = item.empty() ? 0.0 : std::strtod(item.c_str(), &end);
      if (item.empty() || end != item.c_str() + item.size() || !std::isfinite(v) || v <= 0)
        return invalid_argument("--target-layer-split: '{}' is not a positive number", ws[i]);
      w[i] = v;
    }
  }
  if (n_layers < static_cast<int64_t>(devs.size()))
    return invalid_argument("--target-devices names {} devices for a model of {} layers (at least one layer each)",
                            devs.size(), n_layers);
  DF_ASSIGN_OR_RETURN(std::vector<int64_t> ends, split_layer_ends(w, n_layers));
  std::vector<ShardPlan> out;
  int64_t begin = 0;
  for (size_t i = 0; i < devs.size(); ++i) {
    out.push_back(ShardPlan{std::string(devs[i]), begin, ends[i]});
    begin = ends[i];
  }
  return out;
}

std::string describe(const std::vector<ShardPlan>& shards) {
  std::string s;
  for (const ShardPlan& p : shards) {
    if (!s.empty()) s += ' ';
    s += p.device + "[" + std::to_string(p.layer_begin) + "," + std::to_string(p.layer_end) + ")";
  }
  return s;
}

Result<bool> resolve_kv_f16(std::string_view kv_type, const std::vector<ShardPlan>& shards) {
  if (kv_type == "f16") return true;
  if (kv_type == "f32") return false;
  if (kv_type != "auto") return invalid_argument("--kv-type {}: auto, f32 or f16", kv_type);
  if (shards.empty()) return false;
  for (const ShardPlan& p : shards)
    if (p.device.rfind("cuda:", 0) != 0) return false;
  return true;
}

}  // namespace dflash
