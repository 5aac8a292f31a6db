// Draft residency policy: parsing, the --lazy-draft alias, the policy x use table (see draft_residency.h).
#include "placement/draft_residency.h"

namespace dflash {

Result<DraftResidency> parse_draft_residency(std::string_view s) {
  if (s == "auto") return DraftResidency::kAuto;
  if (s == "persistent") return DraftResidency::kPersistent;
  if (s == "request-scoped" || s == "request_scoped") return DraftResidency::kRequestScoped;
  return invalid_argument("draft residency '{}' is not one of auto, persistent, request-scoped (or request_scoped)",
                          s);
}

const char* draft_residency_name(DraftResidency policy) {
  switch (policy) {
    case DraftResidency::kAuto: return "auto";
    case DraftResidency::kPersistent: return "persistent";
    case DraftResidency::kRequestScoped: return "request-scoped";
  }
  return "auto";
}

Result<DraftResidency> resolve_draft_residency(DraftResidency flag, bool flag_given, bool lazy_draft) {
  const DraftResidency given = flag_given ? flag : DraftResidency::kAuto;
  if (!lazy_draft) return given;
  if (given == DraftResidency::kPersistent) {
    return invalid_argument(
        "--lazy-draft (an alias of --draft-residency=request-scoped) contradicts --draft-residency=persistent: "
        "drop one of them");
  }
  return DraftResidency::kRequestScoped;
}

DraftAction draft_action(DraftResidency policy, DraftUse use) {
  switch (policy) {
    case DraftResidency::kPersistent: return DraftAction::kKeepLoaded;
    case DraftResidency::kRequestScoped: return DraftAction::kReleaseAfterUse;
    case DraftResidency::kAuto:
      // A resident PFlash drafter starves prefill on small GPUs and reloads in seconds; the DFlash draft is
      // used on every decode step of every request, so it stays.
      return use == DraftUse::kPFlashCompress ? DraftAction::kReleaseAfterUse : DraftAction::kKeepLoaded;
  }
  return DraftAction::kKeepLoaded;
}

bool parked_at_start(DraftResidency policy, DraftUse use) {
  return draft_action(policy, use) == DraftAction::kReleaseAfterUse;
}

}  // namespace dflash
