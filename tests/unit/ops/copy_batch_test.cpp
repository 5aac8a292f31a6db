// Backend::copy_batch on the reference backend: every item copied as copy() would, and items that overlap one
// another (which a device backend runs at once) refused with nothing copied.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "ops/backend.h"

namespace dflash {
namespace {

TEST(CopyBatch, CopiesEveryItem) {
  CpuBackend be(1);
  std::vector<float> src(100), dst(100, -1.0f);
  std::iota(src.begin(), src.end(), 0.0f);
  const Backend::CopyItem items[] = {{dst.data(), src.data() + 10, 5}, {dst.data() + 50, src.data(), 7},
                                     {dst.data() + 20, src.data() + 90, 0}, {dst.data() + 30, src.data() + 10, 5}};
  ASSERT_TRUE(be.copy_batch(items).ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dst[i], 10.0f + i);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(dst[50 + i], static_cast<float>(i));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dst[30 + i], 10.0f + i) << "two items may read the same source";
  EXPECT_EQ(dst[20], -1.0f);
  EXPECT_EQ(dst[5], -1.0f);
}

TEST(CopyBatch, RefusesOverlappingItemsAndBadOnes) {
  CpuBackend be(1);
  std::vector<float> buf(64);
  std::iota(buf.begin(), buf.end(), 0.0f);
  const std::vector<float> before = buf;
  float* p = buf.data();
  // Item 1 reads what item 0 writes (as a tree commit's KV moves would without scratch).
  const Backend::CopyItem chained[] = {{p + 1, p + 2, 1}, {p + 2, p + 3, 1}};
  EXPECT_EQ(be.copy_batch(chained).code(), ErrorCode::kInvalidArgument);
  // Two items write overlapping ranges.
  const Backend::CopyItem both_write[] = {{p + 10, p + 40, 4}, {p + 12, p + 50, 4}};
  EXPECT_EQ(be.copy_batch(both_write).code(), ErrorCode::kInvalidArgument);
  const Backend::CopyItem negative[] = {{p, p + 8, -1}};
  EXPECT_EQ(be.copy_batch(negative).code(), ErrorCode::kInvalidArgument);
  const Backend::CopyItem null_src[] = {{p, nullptr, 4}};
  EXPECT_EQ(be.copy_batch(null_src).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(buf, before) << "a refused batch copies nothing";
  // Adjacent ranges do not overlap.
  const Backend::CopyItem adjacent[] = {{p, p + 8, 4}, {p + 4, p + 12, 4}};
  ASSERT_TRUE(be.copy_batch(adjacent).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(buf[i], before[8 + i]);
}

}  // namespace
}  // namespace dflash
