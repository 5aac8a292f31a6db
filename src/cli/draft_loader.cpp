#include "cli/draft_loader.h"

#include <filesystem>

#include "base/log.h"

namespace dflash::cli {

void add_draft_options(CLI::App* cmd, DraftOptions& o) {
  cmd->add_option("--draft", o.path,
                  std::string("DFlash draft: a GGUF file or an HF directory (config.json + safetensors); 'none' "
                              "turns drafting off (default: models/") +
                      kDefaultDraftFile + " with the bundled model, else none)");
  cmd->add_flag("--ddtree", o.ddtree, "Verify a DDTree of the draft's top candidates instead of one chain");
  cmd->add_option("--ddtree-budget", o.ddtree_budget, "DDTree: drafted nodes per step at most")->capture_default_str();
  cmd->add_option("--draft-device", o.device, "Device of the draft: cpu or cuda:N (default: the target's)");
  cmd->add_option("--draft-residency", o.residency,
                  "auto | persistent | request-scoped: whether the draft stays loaded between requests")
      ->capture_default_str()
      ->each([&o](const std::string&) { o.residency_given = true; });
  cmd->add_flag("--lazy-draft", o.lazy, "Alias of --draft-residency request-scoped");
  cmd->add_flag("!--no-adaptive-draft", o.adaptive,
                "Keep drafting even where it is measured slower than plain decoding");
}

Result<std::unique_ptr<ResidentDraft>> load_draft(const DraftOptions& o, const std::string& model_path,
                                                  LoadedModel& model, int threads, SpecOptions* spec) {
  namespace fs = std::filesystem;
  DF_ASSIGN_OR_RETURN(DraftResidency flag, parse_draft_residency(o.residency));
  DF_ASSIGN_OR_RETURN(DraftResidency policy, resolve_draft_residency(flag, o.residency_given, o.lazy));
  std::string path = o.path;
  if (path == "none") return std::unique_ptr<ResidentDraft>();
  if (o.ddtree_budget < 1 || o.ddtree_budget > 1024)
    return invalid_argument("--ddtree-budget must be 1..1024 (got {})", o.ddtree_budget);
  if (path.empty()) {
    // The bundled model's draft lies beside it.
    std::error_code ec;
    const fs::path model(model_path);
    if (model.filename() != kDefaultModelFile) return std::unique_ptr<ResidentDraft>();
    const fs::path draft = model.parent_path() / kDefaultDraftFile;
    if (!fs::is_regular_file(draft, ec)) {
      log::warn("the bundled model's draft {} is missing: decoding without a draft", draft.string());
      return std::unique_ptr<ResidentDraft>();
    }
    path = draft.string();
  }
  // Another device than the target's, or a split target (whose embedding and head are on different shards):
  // a backend of the draft's own (features cross through the host), by default on the first shard's device.
  std::unique_ptr<Backend> draft_be;
  const std::string device = o.device.empty() ? model.device_name() : o.device;
  if (device != model.device_name() || model.split()) {
    auto be = make_backend(device, threads);
    if (!be.ok()) return be.status().with_context("--draft-device " + device);
    draft_be = std::move(be).value();
  }
  DF_ASSIGN_OR_RETURN(std::unique_ptr<ResidentDraft> d,
                      ResidentDraft::load(path, model.weights(), model.runner->backend(), *model.host,
                                          std::move(draft_be), policy, threads));
  // The target's plain steps compute a token as its verify steps do (Runner::set_exact_decode): greedy output
  // with the draft equals greedy output without it in this process, bit for bit, whatever the weight type.
  model.runner->set_exact_decode(true);
  spec->ddtree = o.ddtree;
  spec->ddtree_budget = o.ddtree_budget;
  spec->adaptive = o.adaptive;
  log::info("draft: {} ({}; {} on {}, residency {}{})", path, d->spec().summary(), o.ddtree ? "DDTree" : "chain",
            device, draft_residency_name(policy), d->stats().parked ? ", parked until a request" : "");
  return d;
}

}  // namespace dflash::cli
