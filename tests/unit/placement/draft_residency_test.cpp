// Draft residency: parsing (both request-scoped spellings, bad values), names round-trip, the --lazy-draft
// alias rules, and the whole policy x use table with parked_at_start.
#include "placement/draft_residency.h"

#include <gtest/gtest.h>

#include <string>

namespace dflash {
namespace {

constexpr DraftResidency kAllPolicies[] = {DraftResidency::kAuto, DraftResidency::kPersistent,
                                           DraftResidency::kRequestScoped};

TEST(DraftResidency, ParsesEveryAcceptedSpelling) {
  EXPECT_EQ(parse_draft_residency("auto").value(), DraftResidency::kAuto);
  EXPECT_EQ(parse_draft_residency("persistent").value(), DraftResidency::kPersistent);
  EXPECT_EQ(parse_draft_residency("request-scoped").value(), DraftResidency::kRequestScoped);
  EXPECT_EQ(parse_draft_residency("request_scoped").value(), DraftResidency::kRequestScoped);
}

TEST(DraftResidency, RejectsOtherValuesNamingTheAcceptedOnes) {
  for (const char* bad : {"", "Auto", "AUTO", "persistant", "request", "requestscoped", "lazy", " auto", "auto "}) {
    auto r = parse_draft_residency(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "'";
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    const std::string& msg = r.status().message();
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
    for (const char* ok : {"auto", "persistent", "request-scoped"}) EXPECT_NE(msg.find(ok), std::string::npos) << msg;
  }
}

TEST(DraftResidency, NamesRoundTripThroughTheParser) {
  EXPECT_STREQ(draft_residency_name(DraftResidency::kAuto), "auto");
  EXPECT_STREQ(draft_residency_name(DraftResidency::kPersistent), "persistent");
  EXPECT_STREQ(draft_residency_name(DraftResidency::kRequestScoped), "request-scoped");
  for (DraftResidency p : kAllPolicies) EXPECT_EQ(parse_draft_residency(draft_residency_name(p)).value(), p);
}

TEST(DraftResidency, WithoutLazyDraftTheFlagIsUsedAsGiven) {
  for (DraftResidency p : kAllPolicies) EXPECT_EQ(resolve_draft_residency(p, true, false).value(), p);
  // Not given: the default, auto, whatever value the unset flag holds.
  for (DraftResidency p : kAllPolicies) {
    EXPECT_EQ(resolve_draft_residency(p, false, false).value(), DraftResidency::kAuto);
  }
}

TEST(DraftResidency, LazyDraftIsAnAliasOfRequestScoped) {
  EXPECT_EQ(resolve_draft_residency(DraftResidency::kAuto, false, true).value(), DraftResidency::kRequestScoped);
  EXPECT_EQ(resolve_draft_residency(DraftResidency::kAuto, true, true).value(), DraftResidency::kRequestScoped);
  EXPECT_EQ(resolve_draft_residency(DraftResidency::kRequestScoped, true, true).value(),
            DraftResidency::kRequestScoped);
  // An unset flag holding persistent is not an explicit persistent.
  EXPECT_EQ(resolve_draft_residency(DraftResidency::kPersistent, false, true).value(),
            DraftResidency::kRequestScoped);
}

TEST(DraftResidency, LazyDraftWithExplicitPersistentIsAConflict) {
  auto r = resolve_draft_residency(DraftResidency::kPersistent, true, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--lazy-draft"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("persistent"), std::string::npos) << r.status().message();
}

TEST(DraftResidency, ActionTableForEveryPolicyAndUse) {
  struct Row {
    DraftResidency policy;
    DraftUse use;
    DraftAction action;
  };
  const Row table[] = {
      {DraftResidency::kPersistent, DraftUse::kDFlashDecode, DraftAction::kKeepLoaded},
      {DraftResidency::kPersistent, DraftUse::kPFlashCompress, DraftAction::kKeepLoaded},
      {DraftResidency::kRequestScoped, DraftUse::kDFlashDecode, DraftAction::kReleaseAfterUse},
      {DraftResidency::kRequestScoped, DraftUse::kPFlashCompress, DraftAction::kReleaseAfterUse},
      {DraftResidency::kAuto, DraftUse::kDFlashDecode, DraftAction::kKeepLoaded},
      {DraftResidency::kAuto, DraftUse::kPFlashCompress, DraftAction::kReleaseAfterUse},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(std::string(draft_residency_name(row.policy)) +
                 (row.use == DraftUse::kDFlashDecode ? " / dflash decode" : " / pflash compress"));
    EXPECT_EQ(draft_action(row.policy, row.use), row.action);
    EXPECT_EQ(parked_at_start(row.policy, row.use), row.action == DraftAction::kReleaseAfterUse);
  }
}

TEST(DraftResidency, LazyDraftParksTheDecodeDraftAtStart) {
  EXPECT_FALSE(parked_at_start(resolve_draft_residency(DraftResidency::kAuto, false, false).value(),
                               DraftUse::kDFlashDecode));
  EXPECT_TRUE(parked_at_start(resolve_draft_residency(DraftResidency::kAuto, false, true).value(),
                              DraftUse::kDFlashDecode));
}

}  // namespace
}  // namespace dflash
