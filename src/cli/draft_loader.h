// The DFlash draft of `serve`, `run` and `bench`: one set of flags (--draft, --ddtree, --ddtree-budget,
// --draft-device, --draft-residency, --lazy-draft) and one loader, so the three subcommands agree.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/status.h"
#include "cli/model_loader.h"
#include "decode/dflash.h"
#include "decode/resident_draft.h"

namespace dflash::cli {

// The bundled default model's DFlash draft (models/, beside the default model; docs/default-model.md): the
// trained bf16 checkpoint (an HF directory, what training continues from) and what is served by default, its
// Q8_0 GGUF (`dflash convert DIR --type q8_0`; its products run the integer-dot kernels, which made a GPU draft
// step up to 0.14 ms faster than the bf16 cuBLAS products, with the same acceptance: docs/benchmarks.md).
inline constexpr const char* kDefaultDraftDir = "default-coder-19m-dflash";
inline constexpr const char* kDefaultDraftFile = "default-coder-19m-dflash-q8_0.gguf";

struct DraftOptions {
  std::string path;  // a DFlash draft (GGUF, or an HF directory in the published layout); "none": no draft;
                     // empty: the bundled model's draft when the model is the bundled one, else none
  bool ddtree = false;
  int64_t ddtree_budget = 22;
  std::string device;  // empty: the target's device (the only placement supported so far)
  std::string residency = "auto";
  bool residency_given = false;  // set by add_draft_options' callback
  bool lazy = false;
  bool adaptive = true;
};

// Adds the draft flags to `cmd`; `o` must outlive the command's parsing.
void add_draft_options(CLI::App* cmd, DraftOptions& o);

// The draft for the target `model` (loaded from `model_path`), or null when there is none; fills `spec`
// with how requests draft. Errors name what is wrong with the draft or the flags.
Result<std::unique_ptr<ResidentDraft>> load_draft(const DraftOptions& o, const std::string& model_path,
                                                  LoadedModel& model, int threads, SpecOptions* spec);

}  // namespace dflash::cli
