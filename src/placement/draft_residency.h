// Draft residency (FEATURES.md F1; anchor-lucebox.md §9): the one policy that decides, for every use of a
// draft model, whether the draft stays loaded when that use ends or is released ("parked": its device memory
// freed, reloaded the next time a request needs it).
//
// `--draft-residency auto|persistent|request-scoped` picks the policy; `--lazy-draft` is kept as an alias of
// request-scoped and is applied in exactly one place, resolve_draft_residency(). Every draft-producing path
// (DFlash decode, PFlash compression, the next one) asks draft_action() instead of adding a lifecycle flag.
#pragma once

#include <string_view>

#include "base/status.h"

namespace dflash {

enum class DraftResidency {
  kAuto,          // default: the DFlash draft stays resident; the PFlash drafter is released after each use
  kPersistent,    // every draft stays loaded across requests
  kRequestScoped  // a draft is loaded when a request needs it and parked as soon as its work is done
};

// What a draft is used for.
enum class DraftUse {
  kDFlashDecode,    // the DFlash draft during speculative decoding (released, if so, at the end of decoding)
  kPFlashCompress,  // the PFlash drafter scoring a long prompt (released, if so, right after compression)
};

// What happens to the draft when one use of it ends.
enum class DraftAction { kKeepLoaded, kReleaseAfterUse };

// "auto", "persistent", "request-scoped" (also "request_scoped"). Anything else: invalid_argument naming
// the accepted values.
Result<DraftResidency> parse_draft_residency(std::string_view s);

// The flag spelling of a policy: "auto", "persistent", "request-scoped" (what GET /props reports).
const char* draft_residency_name(DraftResidency policy);

// The policy in force, from `--draft-residency` (flag; flag_given: the user wrote it) and `--lazy-draft`
// (lazy_draft). Without lazy_draft: the flag as given (auto when not given). With lazy_draft: request-scoped
// when the flag is absent, auto or request-scoped; an explicit persistent contradicts it: invalid_argument
// saying so. The only place the alias is applied.
Result<DraftResidency> resolve_draft_residency(DraftResidency flag, bool flag_given, bool lazy_draft);

// The policy x use table:
//                   persistent   request-scoped     auto
//   kDFlashDecode   keep         release after use  keep
//   kPFlashCompress keep         release after use  release after use (large at long context, reloads fast)
DraftAction draft_action(DraftResidency policy, DraftUse use);

// Whether a draft starts parked (not loaded at start-up; loaded when a request first needs it): exactly when
// it is released after each use.
bool parked_at_start(DraftResidency policy, DraftUse use);

}  // namespace dflash
