// plan_target_split (FEATURES.md F2): the layer ranges of a split (shard i ends at round(Σw_≤i / Σw · n),
// every shard at least one layer) and the refusals of bad --target-devices / --target-layer-split values,
// each naming the flag and the offending entry.
#include "placement/target_placement.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace dflash {
namespace {

std::vector<std::pair<int64_t, int64_t>> ranges(const std::vector<ShardPlan>& p) {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (const ShardPlan& s : p) r.emplace_back(s.layer_begin, s.layer_end);
  return r;
}

using R = std::vector<std::pair<int64_t, int64_t>>;

TEST(TargetPlacement, equal_and_weighted_ranges_cover_every_layer_in_order) {
  auto p = plan_target_split("cuda:0,cuda:1", "", 36);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(ranges(*p), (R{{0, 18}, {18, 36}}));
  EXPECT_EQ((*p)[0].device, "cuda:0");
  EXPECT_EQ((*p)[1].device, "cuda:1");

  p = plan_target_split("cuda:0,cuda:1,cpu", "0.3,0.5,0.2", 64);  // 19.2 -> 19, 51.2 -> 51, 64
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(ranges(*p), (R{{0, 19}, {19, 51}, {51, 64}}));
  EXPECT_EQ((*p)[2].device, "cpu");

  p = plan_target_split("cpu,cpu,cpu", "1,2,3", 8);  // 1.33 -> 1, 4, 8
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(ranges(*p), (R{{0, 1}, {1, 4}, {4, 8}}));

  p = plan_target_split(" cpu , cuda:3 ", "2, 2", 5);  // spaces around entries; 2.5 rounds away from zero
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(ranges(*p), (R{{0, 3}, {3, 5}}));
  EXPECT_EQ((*p)[1].device, "cuda:3");

  p = plan_target_split("cuda:1", "", 7);  // one device: the one-shard placement
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(ranges(*p), (R{{0, 7}}));

  std::string eight;
  for (int i = 0; i < 8; ++i) eight += i ? ",cpu" : "cpu";
  p = plan_target_split(eight, "", 8);  // a layer each
  ASSERT_TRUE(p.ok());
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(ranges(*p)[i], (std::pair<int64_t, int64_t>{i, i + 1}));
  EXPECT_EQ(describe(*plan_target_split("cuda:0,cpu", "", 4)), "cuda:0[0,2) cpu[2,4)");
}

TEST(TargetPlacement, refusals_name_the_flag_and_the_entry) {
  struct Bad {
    const char* devices;
    const char* weights;
    int64_t layers;
    const char* flag;
    const char* says;
  };
  const Bad cases[] = {
      {"cuda:0,cuda:0", "", 8, "--target-devices", "cuda:0 twice"},
      {"tpu:0,cpu", "", 8, "--target-devices", "'tpu:0'"},
      {"cuda:x", "", 8, "--target-devices", "'cuda:x'"},
      {"cuda:-1", "", 8, "--target-devices", "'cuda:-1'"},
      {"cpu,,cpu", "", 8, "--target-devices", "empty entry"},
      {"", "", 8, "--target-devices", "empty"},
      {"", "1,2", 8, "--target-layer-split", "needs --target-devices"},
      {"cpu,cpu", "1", 8, "--target-layer-split", "1 weights for 2 devices"},
      {"cpu,cpu", "1,2,3", 8, "--target-layer-split", "3 weights for 2 devices"},
      {"cpu,cpu", "1,0", 8, "--target-layer-split", "'0'"},
      {"cpu,cpu", "1,-2", 8, "--target-layer-split", "'-2'"},
      {"cpu,cpu", "1,abc", 8, "--target-layer-split", "'abc'"},
      {"cpu,cpu", "1,inf", 8, "--target-layer-split", "'inf'"},
      {"cpu,cpu", "1,nan", 8, "--target-layer-split", "'nan'"},
      {"cpu,cpu", "1,", 8, "--target-layer-split", "''"},
      {"cpu,cpu,cpu", "", 2, "--target-devices", "3 devices for a model of 2 layers"},
      {"cpu,cpu", "1,1000", 8, "--target-layer-split", "shard 0 would get no layer"},
      {"cpu,cpu,cpu", "10,1,10", 8, "--target-layer-split", "shard 1 would get no layer"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(std::string(c.devices) + " / " + c.weights);
    auto p = plan_target_split(c.devices, c.weights, c.layers);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find(c.flag), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find(c.says), std::string::npos) << p.status().message();
  }
}

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

// --kv-type: auto is fp16 only when every shard is a GPU; f32 and f16 are what they say; anything else is
// refused, naming the flag.
TEST(TargetPlacement, kv_type_auto_is_fp16_on_gpu_only_placements) {
  const std::vector<ShardPlan> gpu = {{"cuda:0", 0, 18}, {"cuda:1", 18, 36}};
  const std::vector<ShardPlan> mixed = {{"cuda:0", 0, 30}, {"cpu", 30, 36}};
  const std::vector<ShardPlan> cpu = {{"cpu", 0, 36}};
  EXPECT_TRUE(*resolve_kv_f16("auto", gpu));
  EXPECT_TRUE(*resolve_kv_f16("auto", {{"cuda:3", 0, 36}}));
  EXPECT_FALSE(*resolve_kv_f16("auto", mixed));
  EXPECT_FALSE(*resolve_kv_f16("auto", cpu));
  EXPECT_FALSE(*resolve_kv_f16("auto", {}));
  EXPECT_FALSE(*resolve_kv_f16("f32", gpu));
  EXPECT_TRUE(*resolve_kv_f16("f16", cpu));
  for (const char* bad : {"", "F16", "f8", "bf16", "auto "}) {
    const Result<bool> r = resolve_kv_f16(bad, gpu);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--kv-type"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace dflash
