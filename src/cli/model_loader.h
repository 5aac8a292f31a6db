// Loads a model for a subcommand onto the device the user named (--device cpu | cuda:N) or across the
// devices of a layer split (--target-devices, --target-layer-split: FEATURES.md F2): the weights, the backends
// they live in, and a Runner over them. One place, used by serve, run, logits and bench.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/status.h"
#include "decode/runner.h"
#include "model/weights.h"
#include "ops/backend.h"
#include "placement/target_placement.h"

namespace dflash::cli {

// Where a subcommand puts its target: one device, or a layer split.
struct PlacementFlags {
  std::string device = "cpu";    // --device cpu | cuda:N
  std::string target_devices;    // --target-devices cuda:0,cuda:1,cpu (excludes --device)
  std::string target_layer_split;  // --target-layer-split w0,w1,... (default equal)
  std::string kv_type = "auto";    // --kv-type auto | f32 | f16 (the attention KV's element type; auto: f16
                                   // when every shard is a GPU, else f32)
  int64_t prefill_chunk = 0;       // --prefill-chunk N: prompt tokens a prefill step (0: Runner's default)
};
// Registers --device, --target-devices, --target-layer-split, --kv-type and --prefill-chunk on `cmd`.
void add_placement_flags(CLI::App* cmd, PlacementFlags* flags);
// The checks of the flags that need no model (serve makes them before it listens); load_model makes them too.
Status check_placement_flags(const PlacementFlags& where);

struct LoadedModel {
  std::vector<std::unique_ptr<Backend>> backends;  // declared first: weights and runner release memory through them
  std::unique_ptr<Weights> host;                   // as read from the file
  std::vector<std::unique_ptr<Weights>> device;    // per shard: its tensors copied to its device (null: a CPU shard)
  std::unique_ptr<Runner> runner;
  std::vector<ShardPlan> placement;  // one entry per shard, in layer order
  // The first shard's weights (the whole model's when not split).
  const Weights& weights() const { return !device.empty() && device[0] ? *device[0] : *host; }
  bool split() const { return placement.size() > 1; }
  // The first shard's device.
  const std::string& device_name() const { return placement.front().device; }
  // "cuda:0", or a split's "cuda:0[0,18) cpu[18,36)".
  std::string placement_name() const { return split() ? describe(placement) : device_name(); }
};

// The target on `where`: "cpu" (default) or "cuda:N" (when this build has CUDA), or split across
// --target-devices in the --target-layer-split proportions. Each shard loads only its layers (a CUDA shard
// copies just those tensors; a CPU shard reads them from the file's mapping).
Result<LoadedModel> load_model(const std::string& path, const PlacementFlags& where, int threads);
// A backend of its own on `device` ("cpu" or "cuda:N"), e.g. for a draft on another device than its target.
Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads);

// The bundled default model's file name (models/ of the source tree; docs/default-model.md).
inline constexpr const char* kDefaultModelFile = "default-coder-19m-q8_0.gguf";

// Where the bundled default model is, for `serve` and `run` without a model: $DFLASH_DEFAULT_MODEL when
// set, else the first of <exe>/../share/dflash/models, <exe>/../../models (a build tree), <exe>/models,
// and the source tree's models/ that holds the file. Not found: an error that says what to pass instead.
Result<std::string> default_model_path();
// For subcommands whose model is optional: an empty `model` becomes default_model_path() (logged as
// "<command>: no model given: ..."); the help text of their model option.
Status model_or_default(const char* command, std::string& model);
std::string model_option_help();

}  // namespace dflash::cli
