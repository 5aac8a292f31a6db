// Loads a model for a subcommand onto the device the user named (--device cpu | cuda:N): the weights,
// the backend they live in, and a Runner over them. One place, used by run, logits and bench.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "decode/runner.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace dflash::cli {

struct LoadedModel {
  std::unique_ptr<Backend> backend;  // declared first: weights and runner release memory through it
  std::unique_ptr<Weights> host;     // as read from the file
  std::unique_ptr<Weights> device;   // copied to the device backend (null on the CPU)
  std::unique_ptr<Runner> runner;
  const Weights& weights() const { return device ? *device : *host; }
  std::string device_name;
};

// `device`: "cpu" (default) or "cuda:N" (when this build has CUDA).
Result<LoadedModel> load_model(const std::string& path, const std::string& device, int threads);
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
