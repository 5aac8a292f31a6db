// Device dequantization against the CPU reference (tensor/quant.h): bit equality for every source type,
// shape and output type (f32; bf16/f16 = the CPU value rounded to nearest even), at any alignment;
// special values; argument errors that must write nothing.
#include "ops/cuda/dequantize.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ops/cuda/dequantize_host.h"
#include "ops/cuda/fill.h"
#include "support/random_blocks.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"
#include "unit/ops/ops_test_util.h"
#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/quant.h"

namespace dflash {
namespace {

constexpr DType kTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0, DType::kQ4_1,
                            DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,
                            DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K};

enum class Out { kF32, kBF16, kF16 };
constexpr Out kOuts[] = {Out::kF32, Out::kBF16, Out::kF16};
const char* out_name(Out o) { return o == Out::kF32 ? "f32" : (o == Out::kBF16 ? "bf16" : "f16"); }
size_t out_bytes(Out o) { return o == Out::kF32 ? 4 : 2; }

// Poison patterns no conversion can produce: a signaling f32 NaN (half-float sources widen to quiet NaNs;
// f32 sources are re-rolled away from it), and 0x7e01 for 16-bit outputs (a NaN with the quiet bit of
// bf16 clear, which fp32_to_bf16 always sets, and not fp16's only NaNs 0x7e00 / 0xfe00).
constexpr uint32_t kPoison32 = 0x7f800001u;
constexpr uint16_t kPoison16 = 0x7e01u;
uint32_t poison_word(Out o) { return o == Out::kF32 ? kPoison32 : (uint32_t{kPoison16} << 16 | kPoison16); }

// Elements after the output that must stay poisoned.
constexpr int64_t kGuard = 37;


uint32_t elems_per_block(DType t) { return dtype_info(t)->block_elems; }
uint64_t bytes_for(DType t, int64_t n) { return row_bytes(t, static_cast<uint64_t>(n)).value(); }

// `bytes` bytes of a type's source tensor: codes and packed scales arbitrary, float scales finite (or
// often inf/NaN when asked). Plain float types get arbitrary bits (NaN and inf included) except the f32
// poison word.
std::vector<uint8_t> random_source(DType t, uint64_t bytes, std::mt19937& rng, bool nonfinite_scales = false) {
  std::vector<uint8_t> out(bytes);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  if (t == DType::kF32) {
    for (size_t i = 0; i + 4 <= out.size(); i += 4) {
      uint32_t w;
      std::memcpy(&w, out.data() + i, 4);
      while (w == kPoison32) w = rng();
      std::memcpy(out.data() + i, &w, 4);
    }
    return out;
  }
  test::randomize_block_scales(t, out.data(), out.size(), rng, nonfinite_scales);
  return out;
}

// Runs the Status API on device pointers.
Status dequantize_on_device(DType t, const void* src, void* dst, Out out, int64_t rows, int64_t cols) {
  switch (out) {
    case Out::kF32: return cuda::dequantize_rows_to_f32(t, src, static_cast<float*>(dst), rows, cols);
    case Out::kBF16: return cuda::dequantize_rows_to_bf16(t, src, static_cast<__nv_bfloat16*>(dst), rows, cols);
    case Out::kF16: return cuda::dequantize_rows_to_f16(t, src, static_cast<__half*>(dst), rows, cols);
  }
  return Status();
}

// Runs the cudaError_t API on device pointers.
cudaError_t dequantize_raw(DType t, const void* src, void* dst, Out out, int64_t rows, int64_t cols) {
  switch (out) {
    case Out::kF32: return cuda::dequantize_rows(t, src, static_cast<float*>(dst), rows, cols);
    case Out::kBF16: return cuda::dequantize_rows(t, src, static_cast<__nv_bfloat16*>(dst), rows, cols);
    case Out::kF16: return cuda::dequantize_rows(t, src, static_cast<__half*>(dst), rows, cols);
  }
  return cudaSuccess;
}

// The expected output bits of one element from the CPU's f32 value.
uint32_t expected_bits(Out out, float cpu) {
  switch (out) {
    case Out::kF32: return std::bit_cast<uint32_t>(cpu);
    case Out::kBF16: return fp32_to_bf16(cpu);
    case Out::kF16: return fp32_to_fp16(cpu);
  }
  return 0;
}

bool is_nan_bits(Out out, uint32_t bits) {
  switch (out) {
    case Out::kF32: return (bits & 0x7fffffffu) > 0x7f800000u;
    case Out::kBF16: return (bits & 0x7fffu) > 0x7f80u;
    case Out::kF16: return (bits & 0x7fffu) > 0x7c00u;
  }
  return false;
}

// A poisoned device output of `elems` elements plus the guard, at `dst_offset` elements into its buffer.
struct PoisonedOutput {
  PoisonedOutput(Out o, int64_t elems, int64_t dst_offset)
      : out(o), offset(dst_offset), total(dst_offset + elems + kGuard),
        words((static_cast<uint64_t>(total) * out_bytes(o) + 3) / 4), buffer(words * 4) {}
  uint8_t* dst() const { return buffer.get() + offset * out_bytes(out); }
  // The whole buffer's elements, as bits.
  std::vector<uint32_t> read() const {
    std::vector<uint8_t> host(words * 4);
    if (cudaMemcpy(host.data(), buffer.get(), host.size(), cudaMemcpyDeviceToHost) != cudaSuccess) return {};
    std::vector<uint32_t> bits(static_cast<size_t>(total));
    for (int64_t i = 0; i < total; ++i) {
      if (out == Out::kF32) {
        std::memcpy(&bits[i], host.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, host.data() + 2 * i, 2);
        bits[i] = h;
      }
    }
    return bits;
  }
  uint32_t poison() const { return out == Out::kF32 ? kPoison32 : kPoison16; }

  Out out;
  int64_t offset, total;
  uint64_t words;
  test::DeviceBuffer buffer;
};

struct Case {
  DType type;
  Out out;
  int64_t rows, cols;
  int64_t src_offset = 0;  // bytes into the device source buffer
  int64_t dst_offset = 0;  // elements into the device output buffer
  bool nonfinite_scales = false;
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.type)) + " -> " + out_name(c.out) + ", " + std::to_string(c.rows) + " x " +
         std::to_string(c.cols) + ", src +" + std::to_string(c.src_offset) + " B, dst +" +
         std::to_string(c.dst_offset) + " elems" + (c.nonfinite_scales ? ", inf/NaN scales" : "");
}

// Dequantizes `source` on the device and compares every element with the CPU reference; checks that
// the elements before and after the output stay poisoned.
void check_against_cpu(const Case& c, const std::vector<uint8_t>& source) {
  SCOPED_TRACE(describe(c));
  const uint64_t row_size = bytes_for(c.type, c.cols);
  ASSERT_EQ(source.size(), row_size * static_cast<uint64_t>(c.rows));
  const int64_t n = c.rows * c.cols;

  std::vector<float> cpu(static_cast<size_t>(n));
  for (int64_t r = 0; r < c.rows; ++r)
    ASSERT_TRUE(dequantize_row(c.type, source.data() + r * row_size, cpu.data() + r * c.cols, c.cols).ok());

  const std::vector<uint8_t> device = test::device_form(c.type, source, c.rows, c.cols);  // weight_form.h
  ASSERT_FALSE(device.empty());
  test::DeviceBuffer src(device.size() + static_cast<size_t>(c.src_offset));
  DF_ASSERT_CUDA(src.error());
  DF_ASSERT_CUDA(cudaMemcpy(src.get() + c.src_offset, device.data(), device.size(), cudaMemcpyHostToDevice));
  PoisonedOutput dst(c.out, n, c.dst_offset);
  DF_ASSERT_CUDA(dst.buffer.error());
  DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dst.buffer.get()), dst.words, poison_word(c.out)));

  const Status st = dequantize_on_device(c.type, src.get() + c.src_offset, dst.dst(), c.out, c.rows, c.cols);
  ASSERT_TRUE(st.ok()) << st.to_string();
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint32_t> got = dst.read();
  ASSERT_EQ(got.size(), static_cast<size_t>(dst.total));

  int64_t mismatches = 0;
  std::string first;
  for (int64_t i = 0; i < dst.total; ++i) {
    const int64_t e = i - c.dst_offset;  // element index in the output, or outside it
    const bool inside = e >= 0 && e < n;
    const uint32_t want = inside ? expected_bits(c.out, cpu[static_cast<size_t>(e)]) : dst.poison();
    bool ok = got[i] == want;
    // With inf/NaN scales the CPU and GPU make different default NaNs: only NaN-ness must agree.
    if (!ok && inside && c.nonfinite_scales && is_nan_bits(c.out, want)) ok = is_nan_bits(c.out, got[i]);
    if (ok) continue;
    if (mismatches++ == 0) {
      char buf[256];
      if (inside)
        std::snprintf(buf, sizeof buf, "row %lld col %lld: got 0x%08x, want 0x%08x (cpu f32 %.9g)",
                      static_cast<long long>(e / c.cols), static_cast<long long>(e % c.cols), got[i], want,
                      static_cast<double>(cpu[static_cast<size_t>(e)]));
      else
        std::snprintf(buf, sizeof buf, "element %lld outside the output was overwritten: 0x%08x",
                      static_cast<long long>(e), got[i]);
      first = buf;
    }
  }
  if (mismatches != 0)
    ADD_FAILURE() << "MISMATCH " << describe(c) << ": " << mismatches << " of " << dst.total
                  << " elements (output + guard) differ; first at " << first;
}

void check_random(const Case& c, std::mt19937& rng) {
  const auto source =
      random_source(c.type, bytes_for(c.type, c.cols) * static_cast<uint64_t>(c.rows), rng, c.nonfinite_scales);
  check_against_cpu(c, source);
}

class CudaDequantize : public testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
    seed_ = test::fresh_seed();
    rng_.seed(seed_);
  }
  // For SCOPED_TRACE: how to reproduce a failure.
  std::string seed_note() const {
    return "seed " + std::to_string(seed_) + " (rerun with DFLASH_TEST_SEED=" + std::to_string(seed_) + ")";
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

// ---- Bit equality with the CPU ----

TEST_F(CudaDequantize, every_type_and_shape_matches_cpu_bit_for_bit_in_f32_bf16_and_f16) {
  SCOPED_TRACE(seed_note());
  for (DType t : kTypes) {
    std::vector<int64_t> blocks_per_row = {1, 2, 7, 16};
    if (elems_per_block(t) == 1) blocks_per_row.push_back(1000);  // plain types: many CTAs too
    for (Out out : kOuts)
      for (int64_t rows : {1, 3, 64})
        for (int64_t blocks : blocks_per_row) {
          check_random({t, out, rows, blocks * elems_per_block(t)}, rng_);
          if (HasFailure()) return;  // one failing case is enough to read
        }
  }
}

TEST_F(CudaDequantize, unaligned_source_and_destination_match_cpu) {
  SCOPED_TRACE(seed_note());
  for (DType t : kTypes)
    for (Out out : kOuts)
      for (int64_t src_offset : {1, 2, 3, 6, 15, 16, 48})
        for (int64_t dst_offset : {0, 1, 3}) {
          // The split device forms are 16-byte aligned (other offsets are refused: bad_shapes_...).
          if (cuda::device_weight_align(t) == 16 && src_offset % 16 != 0) continue;
          check_random({t, out, 3, 7 * elems_per_block(t), src_offset, dst_offset}, rng_);
          if (HasFailure()) return;  // one failing case is enough to read
        }
}

TEST_F(CudaDequantize, many_tiles_and_a_partial_last_tile_match_cpu) {
  SCOPED_TRACE(seed_note());
  // 4096 elements per CTA tile: these span dozens of tiles and end in a partial one.
  for (DType t : kTypes)
    for (Out out : kOuts) {
      check_random({t, out, 37, 41 * static_cast<int64_t>(elems_per_block(t))}, rng_);
      if (HasFailure()) return;  // one failing case is enough to read
    }
}

// f32 sources exercise the narrowing alone: exact halfway cases, the fp16 overflow threshold, subnormals
// on both sides, NaN payloads.
TEST_F(CudaDequantize, f32_special_values_narrow_like_half_h) {
  const uint32_t specials[] = {
      0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x3f800000u, 0xbf800000u,
      0x477fe000u,  // 65504, the largest fp16
      0x477fefffu,  // just under 65520: rounds down to 65504
      0x477ff000u,  // 65520: halfway, ties to even = inf
      0x47800000u, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
      0x7fc00000u, 0xffc00000u, 0x7f800002u, 0x7fa00001u, 0xffffffffu,  // NaNs, quiet and signaling
      0x33800000u,  // 2^-24, the smallest fp16 subnormal
      0x33000000u,  // 2^-25: halfway to zero, ties to even = 0
      0x33000001u,  // just above: rounds up to 2^-24
      0x33c00000u,  // 1.5 * 2^-24: tie between subnormals 1 and 2, to even = 2
      0x387fc000u,  // halfway between the largest subnormal and the smallest normal fp16
      0x3f808000u,  // 1 + 2^-8: bf16 tie, to even = 1
      0x3f818000u,  // 1 + 3 * 2^-8: bf16 tie, to even = 1 + 2^-6
      0x3f801000u,  // 1 + 2^-11: fp16 tie, to even = 1
      0x3f803000u,  // 1 + 3 * 2^-11: fp16 tie, to even = 1 + 2^-9
      0x7f7f8000u,  // bf16 tie at the top: rounds to inf
      0x00008000u, 0x00018000u,  // bf16 ties among f32 subnormals
  };
  std::vector<uint8_t> source(sizeof specials);
  std::memcpy(source.data(), specials, sizeof specials);
  const auto n = static_cast<int64_t>(std::size(specials));
  for (Out out : kOuts) {
    check_against_cpu({DType::kF32, out, 1, n}, source);
    check_against_cpu({DType::kF32, out, n, 1}, source);
  }
  // And every fp16 and bf16 bit pattern through the f16 / bf16 sources.
  std::vector<uint8_t> all(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    all[2 * h] = static_cast<uint8_t>(h);
    all[2 * h + 1] = static_cast<uint8_t>(h >> 8);
  }
  for (DType t : {DType::kF16, DType::kBF16})
    for (Out out : kOuts) check_against_cpu({t, out, 256, 256}, all);
}

TEST_F(CudaDequantize, inf_and_nan_scales_give_nan_exactly_where_the_cpu_does) {
  SCOPED_TRACE(seed_note());
  for (DType t : kTypes) {
    if (!dtype_info(t)->quantized) continue;
    for (Out out : kOuts) {
      Case c{t, out, 5, 7 * static_cast<int64_t>(elems_per_block(t))};
      c.nonfinite_scales = true;
      check_random(c, rng_);
      if (HasFailure()) return;  // one failing case is enough to read
    }
  }
}

// ---- Argument errors ----

// Runs a call that must fail on a poisoned buffer and checks nothing was written.
void expect_nothing_written(const PoisonedOutput& dst) {
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto got = dst.read();
  ASSERT_EQ(got.size(), static_cast<size_t>(dst.total));
  for (int64_t i = 0; i < dst.total; ++i) ASSERT_EQ(got[i], dst.poison()) << "element " << i << " was written";
}

TEST_F(CudaDequantize, unsupported_type_is_an_error_and_writes_nothing) {
  test::DeviceBuffer src(4096);
  DF_ASSERT_CUDA(src.error());
  DF_ASSERT_CUDA(cudaMemset(src.get(), 0x11, 4096));
  for (DType t : {DType::kQ8_1, DType::kI8, DType::kI32, DType::kF64, static_cast<DType>(99u)})
    for (Out out : kOuts) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " -> " + out_name(out));
      PoisonedOutput dst(out, 256, 0);
      DF_ASSERT_CUDA(dst.buffer.error());
      DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dst.buffer.get()), dst.words, poison_word(out)));
      EXPECT_FALSE(cuda::dequantize_supported(t));
      EXPECT_EQ(dequantize_raw(t, src.get(), dst.dst(), out, 1, 256), cudaErrorInvalidValue);
      const Status st = dequantize_on_device(t, src.get(), dst.dst(), out, 1, 256);
      EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
      EXPECT_NE(st.message().find("not supported"), std::string::npos) << st.message();
      expect_nothing_written(dst);
    }
}

TEST_F(CudaDequantize, bad_shapes_and_null_pointers_are_errors_and_write_nothing) {
  test::DeviceBuffer src(1 << 16);
  DF_ASSERT_CUDA(src.error());
  DF_ASSERT_CUDA(cudaMemset(src.get(), 0, 1 << 16));
  struct Bad {
    DType type;
    int64_t rows, cols;
    bool null_src;
    const char* message;  // expected in the Status message
  };
  const Bad bad[] = {
      {DType::kQ4_0, 1, 33, false, "not a multiple of the block size 32"},
      {DType::kQ8_0, 2, 16, false, "not a multiple of the block size 32"},
      {DType::kQ4_K, 1, 255, false, "not a multiple of the block size 256"},
      {DType::kQ6_K, 3, 384, false, "not a multiple of the block size 256"},
      {DType::kQ2_K, 1, 32, false, "not a multiple of the block size 256"},
      {DType::kQ4_0, -1, 32, false, "negative shape"},
      {DType::kF16, 1, -2, false, "negative shape"},
      {DType::kQ4_K, std::numeric_limits<int64_t>::max() / 2, 256, false, "overflows"},
      {DType::kF32, 1, 16, true, "null source pointer"},
  };
  for (const Bad& b : bad)
    for (Out out : kOuts) {
      SCOPED_TRACE(std::string(dtype_name(b.type)) + " " + std::to_string(b.rows) + " x " + std::to_string(b.cols) +
                   " -> " + out_name(out));
      PoisonedOutput dst(out, 512, 0);
      DF_ASSERT_CUDA(dst.buffer.error());
      DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dst.buffer.get()), dst.words, poison_word(out)));
      const void* s = b.null_src ? nullptr : src.get();
      EXPECT_EQ(dequantize_raw(b.type, s, dst.dst(), out, b.rows, b.cols), cudaErrorInvalidValue);
      const Status st = dequantize_on_device(b.type, s, dst.dst(), out, b.rows, b.cols);
      EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
      EXPECT_NE(st.message().find(b.message), std::string::npos) << st.message();
      expect_nothing_written(dst);
    }
  // The split device forms (ops/cuda/weight_form.h: q6_K, q8_0, q4_0) are 16-byte aligned: any other source
  // address is refused.
  for (DType t : {DType::kQ6_K, DType::kQ8_0, DType::kQ4_0})
    for (Out out : kOuts) {
      PoisonedOutput dst(out, 512, 0);
      DF_ASSERT_CUDA(dst.buffer.error());
      DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dst.buffer.get()), dst.words, poison_word(out)));
      for (int64_t offset : {2, 8}) {
        EXPECT_EQ(dequantize_raw(t, src.get() + offset, dst.dst(), out, 2, 256), cudaErrorInvalidValue);
        const Status st = dequantize_on_device(t, src.get() + offset, dst.dst(), out, 2, 256);
        EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
        EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.message();
      }
      expect_nothing_written(dst);
    }
  // A null destination is refused too (nothing to inspect).
  EXPECT_EQ(cuda::dequantize_rows(DType::kQ4_0, src.get(), static_cast<float*>(nullptr), 1, 32),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::dequantize_rows_to_f32(DType::kQ4_0, src.get(), nullptr, 1, 32).code(),
            ErrorCode::kInvalidArgument);
}

TEST_F(CudaDequantize, empty_tensor_is_a_no_op) {
  test::DeviceBuffer src(256);
  DF_ASSERT_CUDA(src.error());
  for (Out out : kOuts) {
    PoisonedOutput dst(out, 64, 0);
    DF_ASSERT_CUDA(dst.buffer.error());
    DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dst.buffer.get()), dst.words, poison_word(out)));
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{0, 256}, {5, 0}, {0, 0}}) {
      EXPECT_EQ(dequantize_raw(DType::kQ4_K, src.get(), dst.dst(), out, rows, cols), cudaSuccess);
      EXPECT_TRUE(dequantize_on_device(DType::kQ4_K, src.get(), dst.dst(), out, rows, cols).ok());
      EXPECT_TRUE(dequantize_on_device(DType::kQ4_K, nullptr, nullptr, out, rows, cols).ok());
    }
    expect_nothing_written(dst);
  }
}

// Host-only: the device supports exactly the types the CPU converts.
TEST(CudaDequantizeTypes, supported_types_are_those_of_the_cpu_codecs) {
  for (uint32_t id = 0; id < 64; ++id) {
    const auto t = static_cast<DType>(id);
    EXPECT_EQ(cuda::dequantize_supported(t), row_conversion_supported(t)) << "type id " << id;
  }
}

// Host-only: the device form (ops/cuda/weight_form.h). A q6_K row keeps each block's first 208 bytes in block
// order, then the blocks' d, then zeros to a multiple of 16 bytes; q8_0, q4_0 and q2_K the same with their
// bodies (q2_K: a 4-byte (d, dmin) entry a block); q3_K keeps its blocks, each padded to 112 bytes; every other
// type is copied as it is.
TEST(CudaWeightForm, split_rows_hold_each_block_body_then_the_scales) {
  std::mt19937 rng(test::fresh_seed());
  for (int64_t blocks : {1, 2, 7, 8, 9, 16, 20, 68}) {
    const int64_t rows = 3, cols = 256 * blocks, stored_rb = 210 * blocks;
    const int64_t rb = cuda::device_row_bytes(DType::kQ6_K, cols);
    EXPECT_EQ(rb, 208 * blocks + (2 * blocks + 15) / 16 * 16) << blocks;
    EXPECT_EQ(rb % 16, 0);
    const auto stored = test::random_blocks(DType::kQ6_K, rows * blocks, rng);
    std::vector<uint8_t> dev(static_cast<size_t>(rb * rows), 0xaa);
    ASSERT_TRUE(cuda::to_device_form(DType::kQ6_K, stored.data(), rows, cols, dev.data()));
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* in = stored.data() + r * stored_rb;
      const uint8_t* out = dev.data() + r * rb;
      for (int64_t b = 0; b < blocks; ++b) {
        ASSERT_EQ(std::memcmp(out + 208 * b, in + 210 * b, 208), 0) << "row " << r << " block " << b;
        ASSERT_EQ(std::memcmp(out + cuda::q6k_d_offset(blocks, b), in + 210 * b + 208, 2), 0) << "block " << b;
      }
      for (int64_t i = 208 * blocks + 2 * blocks; i < rb; ++i) ASSERT_EQ(out[i], 0) << "padding byte " << i;
    }
  }
  // q8_0 and q4_0: each block's codes (after its d in the stored block), then the d's.
  for (const auto& [t, body] : {std::pair<DType, int64_t>{DType::kQ8_0, 32}, {DType::kQ4_0, 16}}) {
    const int64_t blocks = 9, rb = cuda::device_row_bytes(t, 32 * blocks);
    EXPECT_EQ(rb, body * blocks + 32);
    const auto stored = test::random_blocks(t, 2 * blocks, rng);
    std::vector<uint8_t> dev(static_cast<size_t>(2 * rb), 0xaa);
    ASSERT_TRUE(cuda::to_device_form(t, stored.data(), 2, 32 * blocks, dev.data()));
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* in = stored.data() + (r * blocks + b) * (body + 2);
        const uint8_t* out = dev.data() + r * rb;
        ASSERT_EQ(std::memcmp(out + body * b, in + 2, static_cast<size_t>(body)), 0) << "row " << r << " block " << b;
        ASSERT_EQ(std::memcmp(out + cuda::split_d_offset(blocks, static_cast<int>(body), b), in, 2), 0) << b;
      }
    EXPECT_EQ(cuda::device_weight_align(t), 16);
  }
  // q2_K: each block's first 80 bytes (scales, qs), then the blocks' (d, dmin) pairs, then zeros.
  {
    const int64_t blocks = 7, rows = 2, rb = cuda::device_row_bytes(DType::kQ2_K, 256 * blocks);
    EXPECT_EQ(rb, 80 * blocks + 32);
    const auto stored = test::random_blocks(DType::kQ2_K, rows * blocks, rng);
    std::vector<uint8_t> dev(static_cast<size_t>(rows * rb), 0xaa);
    ASSERT_TRUE(cuda::to_device_form(DType::kQ2_K, stored.data(), rows, 256 * blocks, dev.data()));
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* out = dev.data() + r * rb;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* in = stored.data() + (r * blocks + b) * 84;
        ASSERT_EQ(std::memcmp(out + 80 * b, in, 80), 0) << "row " << r << " block " << b;
        ASSERT_EQ(std::memcmp(out + cuda::q2k_dm_offset(blocks, b), in + 80, 4), 0) << "row " << r << " block " << b;
      }
      for (int64_t i = 84 * blocks; i < rb; ++i) ASSERT_EQ(out[i], 0) << "padding byte " << i;
    }
    EXPECT_EQ(cuda::device_weight_align(DType::kQ2_K), 16);
  }
  // q3_K (padded): each block's 110 stored bytes, then two zero bytes, 112 bytes a block.
  {
    const int64_t blocks = 5, rows = 2, rb = cuda::device_row_bytes(DType::kQ3_K, 256 * blocks);
    EXPECT_EQ(rb, 112 * blocks);
    const auto stored = test::random_blocks(DType::kQ3_K, rows * blocks, rng);
    std::vector<uint8_t> dev(static_cast<size_t>(rows * rb), 0xaa);
    ASSERT_TRUE(cuda::to_device_form(DType::kQ3_K, stored.data(), rows, 256 * blocks, dev.data()));
    for (int64_t b = 0; b < rows * blocks; ++b) {
      ASSERT_EQ(std::memcmp(dev.data() + 112 * b, stored.data() + 110 * b, 110), 0) << "block " << b;
      ASSERT_EQ(dev[static_cast<size_t>(112 * b + 110)], 0);
      ASSERT_EQ(dev[static_cast<size_t>(112 * b + 111)], 0);
    }
    EXPECT_EQ(cuda::device_weight_align(DType::kQ3_K), 16);
    EXPECT_EQ(cuda::device_row_bytes(DType::kQ3_K, 300), -1);
  }
  // Other types: the stored bytes, the stored row size.
  const auto q4 = test::random_blocks(DType::kQ4_K, 6, rng);
  std::vector<uint8_t> q4_dev(q4.size());
  EXPECT_EQ(cuda::device_row_bytes(DType::kQ4_K, 512), 288);
  ASSERT_TRUE(cuda::to_device_form(DType::kQ4_K, q4.data(), 3, 512, q4_dev.data()));
  EXPECT_EQ(q4, q4_dev);
  EXPECT_EQ(cuda::device_row_bytes(DType::kBF16, 7), 14);
  // Shapes without a form: nothing written.
  EXPECT_EQ(cuda::device_row_bytes(DType::kQ6_K, 300), -1);
  EXPECT_EQ(cuda::device_row_bytes(DType::kQ6_K, -256), -1);
  EXPECT_EQ(cuda::device_row_bytes(static_cast<DType>(99), 256), -1);
  EXPECT_FALSE(cuda::to_device_form(DType::kQ6_K, q4.data(), 1, 300, q4_dev.data()));
  EXPECT_EQ(cuda::device_weight_align(DType::kQ6_K), 16);
  EXPECT_EQ(cuda::device_weight_align(DType::kQ4_1), 1);
}

}  // namespace
}  // namespace dflash
