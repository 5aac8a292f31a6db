// dflash logits --model M --tokens 1,2,3 [--all] --out FILE: raw float32 logits of the last (or every)
// position, plus FILE.json with the shape and each row's top-5.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "cli/commands.h"
#include "cli/model_loader.h"
#include "decode/runner.h"
#include "model/weights.h"
#include "state/sequence_state.h"

namespace dflash::cli {
namespace {

struct LogitsOptions {
  std::string model;
  std::string tokens;
  std::string out;
  bool all = false;
  int threads = 0;
  PlacementFlags where;  // --device, or --target-devices and --target-layer-split
};

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      return invalid_argument("--tokens: '{}' is not a token id", item);
    }
    if (used != item.size() || v < 0 || v > INT32_MAX) return invalid_argument("--tokens: '{}' is not a token id", item);
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return invalid_argument("--tokens is empty");
  return ids;
}

Status run_logits(const LogitsOptions& opt) {
  DF_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_ids(opt.tokens));
  DF_ASSIGN_OR_RETURN(LoadedModel model, load_model(opt.model, opt.where, opt.threads));
  const Weights& weights = model.weights();
  Runner& runner = *model.runner;
  SequenceState state(weights.spec(), runner.state_layout());
  Step step;
  step.tokens = ids;
  step.all_logits = opt.all;
  DF_ASSIGN_OR_RETURN(StepOutput out, runner.forward(state, step));
  const int64_t V = weights.spec().vocab;
  DF_RETURN_IF_ERROR(write_file_atomic(
      opt.out, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(out.logits.data()), out.logits.size() * 4)));
  nlohmann::json meta;
  meta["shape"] = {out.rows, V};
  meta["dtype"] = "f32";
  meta["positions"] = opt.all ? nlohmann::json(std::vector<int64_t>()) : nlohmann::json({static_cast<int64_t>(ids.size()) - 1});
  if (opt.all) {
    std::vector<int64_t> p(ids.size());
    std::iota(p.begin(), p.end(), 0);
    meta["positions"] = p;
  }
  meta["top5"] = nlohmann::json::array();
  for (int64_t r = 0; r < out.rows; ++r) {
    const float* row = out.logits.data() + r * V;
    std::vector<int32_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + std::min<int64_t>(5, V), idx.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    nlohmann::json top = nlohmann::json::array();
    for (int64_t i = 0; i < std::min<int64_t>(5, V); ++i) top.push_back({{"id", idx[i]}, {"logit", row[idx[i]]}});
    meta["top5"].push_back(top);
  }
  std::string text = meta.dump(2);
  return write_file_atomic(opt.out + ".json",
                           std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

}  // namespace

void add_logits_command(CLI::App& app, int& exit_code) {
  auto opt = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "Write the logits of a token sequence as raw float32 (+ JSON sidecar)");
  cmd->add_option("--model,-m", opt->model, "GGUF file or HF model directory")->required();
  cmd->add_option("--tokens", opt->tokens, "Comma-separated token ids")->required();
  cmd->add_option("--out,-o", opt->out, "Output file (raw little-endian float32 [rows, vocab])")->required();
  cmd->add_flag("--all", opt->all, "Logits of every position (default: the last)");
  cmd->add_option("--threads,-t", opt->threads, "CPU threads (default: all cores)");
  add_placement_flags(cmd, &opt->where);
  cmd->callback([opt, &exit_code] {
    Status st = run_logits(*opt);
    exit_code = st.ok() ? 0 : report(st);
  });
}

}  // namespace dflash::cli
