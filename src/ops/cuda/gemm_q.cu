// Fused prefill GEMM of quantized weights (gemm_q.h): decode W to bf16 in shared memory, bf16 mma.sync.
//
// CTA: 256 threads (8 warps), 128 rows of W x BN tokens (64, 128 or 256). The columns run in k-steps of 64;
// four k-steps make one 256-column unit, the grain of every supported type's blocks (a q4_K/q5_K/q6_K
// super-block, eight q8_0 blocks).
//   - Raw W: the unit's bytes of the CTA's 128 rows, by cp.async into one of two buffers (a row's bytes
//     at its own slot), the next unit's issued three k-steps before it is needed.
//   - x: 64 bf16 columns of the BN tokens a k-step, by cp.async, XS stages deep (issued XS - 1 k-steps
//     ahead), rows of 128 bytes with their 16-byte chunks XOR-swizzled by row (conflict-free ldmatrix).
//   - Decode: thread t decodes 32 weights of row t % 128 (half t / 128 of the k-step's 64 columns) to
//     bf16 and stores them as four 16-byte chunks of a 128 x 64 tile (swizzled like x), double-buffered:
//     the k-step after the one being multiplied is decoded while the warps multiply, one chunk between
//     the MMAs of each 16 columns (the k-steps of a unit are unrolled, so every offset is a constant).
//   - MMA: warp w owns rows 32 (w % 4) .. +32 and tokens (BN / 2)(w / 4) .. +BN / 2: m16n8k16 bf16
//     fragments by ldmatrix.x4 from both tiles, f32 accumulators in registers.
// One __syncthreads a k-step orders it all (see the schedule in the kernel).
//
// Column order: within a k-step, "logical" column 8c + e (chunk c) stands for the unit column
// Q::col(quarter, c) + e. For q4_K, q5_K and q8_0 this is the identity; for q6_K a k-step takes, of one
// 128-column half, the columns 32k + 16t + [0, 16) for k = 0..3 (which share their ql/qh bytes), and x's
// chunks are loaded from the same columns, so every product term is still x[j] * W[j].
//
// Exactness of the decode: as ops/cuda/quant_blocks.cuh (hence dequantize_rows): the same float
// operations in the same order, each an explicitly rounded intrinsic; the small integer codes become
// floats exactly through the 2^23 magic number; cvt.rn.bf16x2.f32 rounds to nearest even like
// fp32_to_bf16 for every non-NaN value. Do not build with --use_fast_math.
#include "ops/cuda/gemm_q.h"

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "base/checked_math.h"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_f16.cuh"
#include "ops/cuda/quant_blocks.cuh"
#include "ops/cuda/weight_form.h"

namespace dflash::cuda {
namespace {

using namespace qblocks;  // NOLINT: type ids, fp16_to_f32, load_u16, i2f

constexpr int kBM = 128;     // rows of W per CTA
constexpr int kBK = 64;      // columns per k-step
constexpr int kUnit = 256;   // columns per raw unit
constexpr int kThreads = 256;

// ---- PTX ----

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// ---- Decoding helpers ----

// Byte i of v (a code c < 256) as the float 2^23 + c, minus `bias` (exact for these small integers).
template <int kI>
__device__ __forceinline__ float code_f(uint32_t v, float bias) {
  return __fsub_rn(__uint_as_float(__byte_perm(v, 0x4B000000u, 0x7650u | kI)), bias);
}
constexpr float kMagic = 8388608.0f;  // 2^23

// 8 bytes at an 8-byte aligned shared-memory address.
__device__ __forceinline__ uint2 load8(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }

template <int N>
using IC = std::integral_constant<int, N>;

// f(IC<0>{}), ..., f(IC<N - 1>{}).
template <class F, int... I>
__device__ __forceinline__ void static_for_impl(F& f, std::integer_sequence<int, I...>) {
  (f(IC<I>{}), ...);
}
template <int N, class F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

// Byte k (compile-time) of the little-endian words w.
template <int kK, int kN>
__device__ __forceinline__ uint32_t byte_of(const uint32_t (&w)[kN]) {
  return (w[kK >> 2] >> (8 * (kK & 3))) & 0xffu;
}

// ---- Per-type tile decoders ----
// kUnitBytes: a 256-column unit of a row (its stride); kCopy: the 16-byte
// granules a row and unit copies by cp.async, granule(row, unit, units, g); kSlotBytes: the row's slot in
// shared memory.
// col(q, c): the unit column of logical chunk c in k-step q (0..3). prepare<q>(slot, unit, h, raw): the
// bytes and scales of half h of k-step q; out<q, j>(raw): its output chunk j (8 bf16), logical chunk
// chunk(h, j).

// q4_K / q5_K: d@0 dmin@2 scales@4[12] (qh@16[32]) qs@16|48[128]; x = (d*sc) * q - dmin*m.
// k-step q covers sub-blocks 2q (low nibbles of qs[32q..+32)) and 2q + 1 (high nibbles); half h takes
// bytes 16h..16h+15 of them: columns 64q + 16h + [0, 16) and 64q + 32 + 16h + [0, 16).
// d*sc and dmin*m are exact products (11 by 6 bits), and so is (d*sc) * q (17 by 5 bits): the CPU's
// fl(fl((d*sc) * q) - dmin*m) equals fma(d*sc, q, -(dmin*m)).
template <bool kHigh>
struct GK4 {
  static constexpr int kUnitBytes = kHigh ? 176 : 144, kCopy = kUnitBytes / 16;
  static constexpr int kSlotBytes = kUnitBytes;
  // Granule g of unit `unit` of a row of `units` units.
  __device__ static const uint8_t* granule(const uint8_t* row, int64_t unit, int64_t /*units*/, int g) {
    return row + unit * kUnitBytes + 16 * g;
  }
  __device__ static constexpr int col(int q, int c) { return 64 * q + 8 * c; }
  __device__ static int chunk(int h, int j) { return j < 2 ? 2 * h + j : 2 + 2 * h + j; }
  struct Raw {
    uint32_t qs[4], qh[4];
    float ds[2], nms[2];
  };
  template <int kQ>
  __device__ static void prepare(const uint8_t* b, int /*unit*/, int h, Raw& r) {
    const uint4 hdr = *reinterpret_cast<const uint4*>(b);
    const float d = fp16_bits_hw(hdr.x), dmin = fp16_bits_hw(hdr.x >> 16);
    const uint32_t sb[3] = {hdr.y, hdr.z, hdr.w};  // scales[0..11]
    static_for<2>([&](auto jj) {
      constexpr int j = 2 * kQ + decltype(jj)::value;
      uint32_t sc, m;
      if constexpr (j < 4) {
        sc = byte_of<j>(sb) & 63;
        m = byte_of<j + 4>(sb) & 63;
      } else {
        sc = (byte_of<j + 4>(sb) & 0x0f) | ((byte_of<j - 4>(sb) >> 6) << 4);
        m = (byte_of<j + 4>(sb) >> 4) | ((byte_of<j>(sb) >> 6) << 4);
      }
      r.ds[decltype(jj)::value] = __fmul_rn(d, static_cast<float>(sc));
      r.nms[decltype(jj)::value] = -__fmul_rn(dmin, static_cast<float>(m));
    });
    const uint4 qs = *reinterpret_cast<const uint4*>(b + (kHigh ? 48 : 16) + 32 * kQ + 16 * h);
    r.qs[0] = qs.x, r.qs[1] = qs.y, r.qs[2] = qs.z, r.qs[3] = qs.w;
    if constexpr (kHigh) {
      const uint4 qh = *reinterpret_cast<const uint4*>(b + 16 + 16 * h);
      r.qh[0] = qh.x, r.qh[1] = qh.y, r.qh[2] = qh.z, r.qh[3] = qh.w;
    }
  }
  // Chunk j: the low (j < 2) or high nibbles of words 2(j & 1), 2(j & 1) + 1.
  template <int kQ, int kJ>
  __device__ static uint4 out(const Raw& r) {
    constexpr int hi = kJ >> 1, w0 = 2 * (kJ & 1);
    uint32_t c[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      c[k] = (hi ? r.qs[w0 + k] >> 4 : r.qs[w0 + k]) & 0x0f0f0f0fu;
      if constexpr (kHigh) c[k] |= ((r.qh[w0 + k] >> (2 * kQ + hi)) & 0x01010101u) << 4;
    }
    const float ds = r.ds[hi], nms = r.nms[hi];
    auto v = [&](uint32_t cw, auto i) { return __fmaf_rn(ds, code_f<decltype(i)::value>(cw, kMagic), nms); };
    return make_uint4(pack_bf16(v(c[0], IC<0>{}), v(c[0], IC<1>{})), pack_bf16(v(c[0], IC<2>{}), v(c[0], IC<3>{})),
                      pack_bf16(v(c[1], IC<0>{}), v(c[1], IC<1>{})), pack_bf16(v(c[1], IC<2>{}), v(c[1], IC<3>{})));
  }
};

// q6_K in the device form (weight_form.h): ql@0[128] qh@128[64] scales@192[16] (int8), 208 aligned bytes a
// unit, d (fp16) in the row's scale array; x = (d*sc) * (q - 32). A unit's slot holds its 13 granules and
// the granule of the scale array that holds its d (units 8 (unit / 8) + [0, 8)). Column 128hh + 32k + l
// (l < 32): low 4 bits from ql[64hh + 32(k&1) + l] (nibble k>>1), bits 4-5 from bit pair k of
// qh[32hh + l], scale 8hh + 2k + l/16. k-step q (hh = q>>1, t = q&1) takes l in 16t + [0, 16) for all k;
// half h the 8 columns l = 16t + 8h + [0, 8): logical chunk 2k + h.
struct GQ6K {
  static constexpr int kUnitBytes = kQ6Body, kCopy = kQ6Body / 16 + 1, kSlotBytes = 16 * kCopy;
  __device__ static const uint8_t* granule(const uint8_t* row, int64_t unit, int64_t units, int g) {
    return g < kQ6Body / 16 ? row + unit * kUnitBytes + 16 * g : row + (q6k_d_offset(units, unit) & ~int64_t{15});
  }
  __device__ static constexpr int col(int q, int c) {
    return 128 * (q >> 1) + 32 * (c >> 1) + 16 * (q & 1) + 8 * (c & 1);
  }
  __device__ static int chunk(int h, int j) { return 2 * j + h; }
  struct Raw {
    uint32_t a0[2], a1[2], hb[2];
    float dsc[4];
  };
  template <int kQ>
  __device__ static void prepare(const uint8_t* slot, int unit, int h, Raw& r) {
    const uint8_t* b = slot;
    constexpr int hh = kQ >> 1, t = kQ & 1;
    const float d = fp16_bits_hw(*reinterpret_cast<const uint16_t*>(b + kQ6Body + 2 * (unit & 7)));
    const uint2 s8 = load8(b + 192 + 8 * hh);
    const uint32_t sw[2] = {s8.x, s8.y};
    static_for<4>([&](auto k) {
      constexpr int kk = decltype(k)::value;
      r.dsc[kk] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(byte_of<2 * kk + t>(sw))));
    });
    const int l = 16 * t + 8 * h;
    const uint2 ql0 = load8(b + 64 * hh + l), ql1 = load8(b + 64 * hh + 32 + l);
    const uint2 qh = load8(b + 128 + 32 * hh + l);
    r.a0[0] = ql0.x, r.a0[1] = ql0.y, r.a1[0] = ql1.x, r.a1[1] = ql1.y, r.hb[0] = qh.x, r.hb[1] = qh.y;
  }
  template <int kQ, int kJ>  // kJ = k
  __device__ static uint4 out(const Raw& r) {
    uint32_t c[2];
#pragma unroll
    for (int wi = 0; wi < 2; ++wi) {
      const uint32_t lo = (kJ & 1) ? r.a1[wi] : r.a0[wi];
      const uint32_t nib = ((kJ >> 1) ? lo >> 4 : lo) & 0x0f0f0f0fu;
      const uint32_t hb = r.hb[wi];
      const uint32_t high = kJ == 0 ? hb << 4 : kJ == 1 ? hb << 2 : kJ == 2 ? hb : hb >> 2;
      c[wi] = nib | (high & 0x30303030u);
    }
    const float dsc = r.dsc[kJ];
    constexpr float kBias = kMagic + 32.0f;
    auto v = [&](uint32_t cw, auto i) { return __fmul_rn(dsc, code_f<decltype(i)::value>(cw, kBias)); };
    return make_uint4(pack_bf16(v(c[0], IC<0>{}), v(c[0], IC<1>{})), pack_bf16(v(c[0], IC<2>{}), v(c[0], IC<3>{})),
                      pack_bf16(v(c[1], IC<0>{}), v(c[1], IC<1>{})), pack_bf16(v(c[1], IC<2>{}), v(c[1], IC<3>{})));
  }
};

// q8_0 in the device form (weight_form.h): blocks of 32 int8 codes, 32 aligned bytes each, their fp16 d in the
// row's scale array; eight blocks a unit, x = q * d. A unit's slot holds its 16 granules of codes and the
// granule of the scale array with its 8 d's. k-step q covers blocks 2q, 2q + 1; half h decodes block 2q + h:
// columns 64q + 32h + [0, 32), logical chunks 4h + j.
struct GQ80 {
  static constexpr int kUnitBytes = 8 * kQ80Body, kCopy = kUnitBytes / 16 + 1;
  static constexpr int kSlotBytes = 16 * kCopy;
  __device__ static const uint8_t* granule(const uint8_t* row, int64_t unit, int64_t units, int g) {
    return g < kUnitBytes / 16 ? row + unit * kUnitBytes + 16 * g : row + q80_d_offset(8 * units, 8 * unit);
  }
  __device__ static constexpr int col(int q, int c) { return 64 * q + 8 * c; }
  __device__ static int chunk(int h, int j) { return 4 * h + j; }
  struct Raw {
    uint32_t w[8];
    float d;
  };
  template <int kQ>
  __device__ static void prepare(const uint8_t* slot, int /*unit*/, int h, Raw& r) {
    const int blk = 2 * kQ + h;
    r.d = fp16_bits_hw(*reinterpret_cast<const uint16_t*>(slot + kUnitBytes + 2 * blk));
    const auto* w = reinterpret_cast<const uint4*>(slot + kQ80Body * blk);
    const uint4 w0 = w[0], w1 = w[1];
    const uint32_t wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) r.w[k] = wv[k] ^ 0x80808080u;  // int8 + 128
  }
  template <int kQ, int kJ>
  __device__ static uint4 out(const Raw& r) {
    const float d = r.d;
    constexpr float kBias = kMagic + 128.0f;
    auto v = [&](uint32_t cw, auto i) { return __fmul_rn(code_f<decltype(i)::value>(cw, kBias), d); };
    const uint32_t c0 = r.w[2 * kJ], c1 = r.w[2 * kJ + 1];
    return make_uint4(pack_bf16(v(c0, IC<0>{}), v(c0, IC<1>{})), pack_bf16(v(c0, IC<2>{}), v(c0, IC<3>{})),
                      pack_bf16(v(c1, IC<0>{}), v(c1, IC<1>{})), pack_bf16(v(c1, IC<2>{}), v(c1, IC<3>{})));
  }
};

// ---- The kernel ----

constexpr int kSmemCap = 227 * 1024;  // dynamic shared memory a CTA may have (sm_90)

template <class Q, int BN>
struct Config {
  static constexpr int kRawBytes = (2 * kBM * Q::kSlotBytes + 15) / 16 * 16;
  static constexpr int kWBytes = 2 * kBM * kBK * 2;
  static constexpr int kXStageBytes = BN * kBK * 2;
  static constexpr int kMinBlocks = BN == 64 ? 2 : 1;
  // 4 x stages where they fit (for BN = 64: two CTAs a multiprocessor), else 3.
  static constexpr int kXStages =
      kRawBytes + kWBytes + 4 * kXStageBytes <= (kMinBlocks == 2 ? 112 * 1024 : kSmemCap) ? 4 : 3;
  static constexpr int kSmem = kRawBytes + kWBytes + kXStages * kXStageBytes;
  static_assert(kSmem <= kSmemCap);
};

template <class Q, int BN>
__global__ void __launch_bounds__(kThreads, Config<Q, BN>::kMinBlocks)
    gemm_q_kernel(const uint8_t* __restrict__ w, int64_t rb, int rows, int64_t cols,
                  const __nv_bfloat16* __restrict__ xb, int n, float* __restrict__ y, int units_per_split) {
  using C = Config<Q, BN>;
  constexpr int XS = C::kXStages;
  constexpr int kNT = BN / 16;  // n8 tiles a warp (BN / 2 tokens)
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* raw = smem;
  uint4* wt = reinterpret_cast<uint4*>(smem + C::kRawBytes);
  uint4* xs = reinterpret_cast<uint4*>(smem + C::kRawBytes + C::kWBytes);

  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int tok0 = static_cast<int>(blockIdx.x) * BN, row0 = static_cast<int>(blockIdx.y) * kBM;
  const int64_t units = cols / kUnit;
  const int64_t u_begin = static_cast<int64_t>(blockIdx.z) * units_per_split;
  const int nunits = static_cast<int>(units - u_begin < units_per_split ? units - u_begin : units_per_split);
  const int steps = 4 * nunits;
  y += static_cast<int64_t>(blockIdx.z) * n * rows;  // a split's partial sums (gridDim.z == 1: y itself)

  // Raw W of local unit u into buffer `buf`.
  auto load_raw = [&](int u, int buf) {
    uint8_t* dst = raw + buf * (kBM * Q::kSlotBytes);
    for (int i = tid; i < kBM * Q::kCopy; i += kThreads) {
      const int r = i / Q::kCopy, g = i - r * Q::kCopy;
      const int gr = row0 + r < rows ? row0 + r : rows - 1;
      cp_async16(dst + r * Q::kSlotBytes + 16 * g, Q::granule(w + gr * rb, u_begin + u, units, g));
    }
  };
  // x: thread tid copies chunk c = tid % 8 of tokens tid / 8 + 32p.
  constexpr int kXP = BN * 8 / kThreads;
  const int xc = tid & 7;
  int xtok[kXP];
#pragma unroll
  for (int p = 0; p < kXP; ++p) {
    const int t = (tid >> 3) + 32 * p;
    xtok[p] = tok0 + t < n ? tok0 + t : n - 1;
  }
  auto load_x = [&](int s, auto qc) {  // qc: IC<s & 3>
    uint4* dst = xs + (s % XS) * (BN * 8);
    const int64_t c0 = (u_begin + (s >> 2)) * kUnit + Q::col(decltype(qc)::value, xc);
#pragma unroll
    for (int p = 0; p < kXP; ++p) {
      const int t = (tid >> 3) + 32 * p;
      cp_async16(dst + t * 8 + (xc ^ (t & 7)), xb + static_cast<int64_t>(xtok[p]) * cols + c0);
    }
  };
  // Decoding: thread tid decodes half tid / 128 of row tid % 128.
  const int drow = tid & (kBM - 1), dh = tid >> 7;
  auto slot_of = [&](int s) { return raw + ((s >> 2) & 1) * (kBM * Q::kSlotBytes) + drow * Q::kSlotBytes; };
  auto wt_row = [&](int s) { return wt + (s & 1) * (kBM * 8) + drow * 8; };

  float acc[2][kNT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

  const int wm = warp & 3, wn = warp >> 2;
  // ldmatrix rows of this lane: W rows 32wm + 16mt + (lane & 15), chunk half lane >> 4; x tokens
  // (BN/2)wn + 16nb + (lane & 7) + 8 (lane >> 4), chunk half (lane >> 3) & 1.
  const int a_row = 32 * wm + (lane & 15), a_hi = lane >> 4, a_sw = a_row & 7;
  const int b_tok = (BN / 2) * wn + (lane & 7) + ((lane >> 4) << 3), b_hi = (lane >> 3) & 1, b_sw = b_tok & 7;

  // Schedule (G_s: the cp.async group committed in k-step s). Prologue groups: unit 0 and x 0, then
  // unit 1 and x 1, then x 2 .. XS - 2. K-step s waits until at most XS - 2 groups are pending (so x s
  // and every unit issued before G_{s-2} have landed), then one barrier; G_s: x s + XS - 1 into the
  // stage mma s - 1 read, and at s = 4v (v >= 1) unit v + 1 into the buffer decode 4v - 1 (in k-step
  // 4v - 2) read; then, interleaved, decode s + 1 into the W tile mma s - 1 read, and mma s.
  load_raw(0, 0);
  load_x(0, IC<0>{});
  cp_async_commit();
  if (nunits > 1) load_raw(1, 1);
  if (steps > 1) load_x(1, IC<1>{});
  cp_async_commit();
  if constexpr (XS == 4) {
    if (steps > 2) load_x(2, IC<2>{});
    cp_async_commit();
  }
  cp_async_wait<XS - 2>();
  __syncthreads();
  {
    typename Q::Raw r;
    Q::template prepare<0>(slot_of(0), static_cast<int>(u_begin), dh, r);
    uint4* dst = wt_row(0);
    static_for<4>([&](auto j) {
      dst[Q::chunk(dh, decltype(j)::value) ^ (drow & 7)] = Q::template out<0, decltype(j)::value>(r);
    });
  }

  auto step = [&](auto qc, int s) {
    constexpr int q = decltype(qc)::value, qn = (q + 1) & 3;
    cp_async_wait<XS - 2>();
    __syncthreads();
    if (s + XS - 1 < steps) load_x(s + XS - 1, IC<(q + XS - 1) & 3>{});
    if (q == 0 && s > 0 && (s >> 2) + 1 < nunits) load_raw((s >> 2) + 1, ((s >> 2) + 1) & 1);
    cp_async_commit();
    const bool dec = s + 1 < steps;
    typename Q::Raw r;
    if (dec) Q::template prepare<qn>(slot_of(s + 1), static_cast<int>(u_begin) + ((s + 1) >> 2), dh, r);
    uint4* wnext = wt_row(s + 1);
    const uint4* wtile = wt + (q & 1) * (kBM * 8);
    const uint4* xtile = xs + (XS == 4 ? q : s % XS) * (BN * 8);
    static_for<4>([&](auto kc) {
      constexpr int kk = decltype(kc)::value;
      if (dec) wnext[Q::chunk(dh, kk) ^ (drow & 7)] = Q::template out<qn, kk>(r);
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldmatrix_x4(smem_u32(wtile + (a_row + 16 * mt) * 8 + ((2 * kk + a_hi) ^ a_sw)), a[mt]);
#pragma unroll
      for (int nb = 0; nb < kNT / 2; ++nb) {
        uint32_t b[4];
        ldmatrix_x4(smem_u32(xtile + (b_tok + 16 * nb) * 8 + ((2 * kk + b_hi) ^ b_sw)), b);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16(acc[mt][2 * nb], a[mt], b[0], b[1]);
          mma_bf16(acc[mt][2 * nb + 1], a[mt], b[2], b[3]);
        }
      }
    });
  };
  for (int s = 0; s < steps; s += 4) {
    step(IC<0>{}, s);
    step(IC<1>{}, s + 1);
    step(IC<2>{}, s + 2);
    step(IC<3>{}, s + 3);
  }
  cp_async_wait<0>();

  // Epilogue: acc[mt][nt] = rows g, g + 8 of m-tile mt x tokens 2tg, 2tg + 1 of n-tile nt.
  const int g = lane >> 2, tg = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int r = row0 + 32 * wm + 16 * mt + g;
      const int t = tok0 + (BN / 2) * wn + 8 * nt + 2 * tg;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rr = r + 8 * (e >> 1), tt = t + (e & 1);
        if (rr < rows && tt < n) y[static_cast<int64_t>(tt) * rows + rr] = acc[mt][nt][e];
      }
    }
}

// y[i] = ws[0][i] + ws[1][i] + ... in split order; kVec: 4 elements a thread (count, ws, y 16-byte
// multiples).
template <bool kVec>
__global__ void __launch_bounds__(256) reduce_splits_kernel(const float* __restrict__ ws, int split, int64_t count,
                                                            float* __restrict__ y) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if constexpr (kVec) {
    const auto* w4 = reinterpret_cast<const float4*>(ws);
    auto* y4 = reinterpret_cast<float4*>(y);
    const int64_t c4 = count / 4;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < c4; i += stride) {
      float4 s = w4[i];
      for (int z = 1; z < split; ++z) {
        const float4 v = w4[z * c4 + i];
        s.x = __fadd_rn(s.x, v.x), s.y = __fadd_rn(s.y, v.y), s.z = __fadd_rn(s.z, v.z), s.w = __fadd_rn(s.w, v.w);
      }
      y4[i] = s;
    }
  } else {
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
      float s = ws[i];
      for (int z = 1; z < split; ++z) s = __fadd_rn(s, ws[z * count + i]);
      y[i] = s;
    }
  }
}

// ---- Host side ----

// The types with a fused kernel; each takes rows of whole 256-column units, 16-byte aligned (q4_K and q5_K
// blocks are 144 and 176 bytes; q6_K and q8_0 in their device form, weight_form.h).
constexpr uint32_t kTypes[] = {kQ4_K, kQ5_K, kQ6_K, kQ8_0};
constexpr uintptr_t kWeightAlign = 16;

bool known_type(DType type) {
  for (uint32_t t : kTypes)
    if (t == static_cast<uint32_t>(type)) return true;
  return false;
}

// rb: the bytes of a weight row in device memory (device_row_bytes, weight_form.h).
template <class Q, int BN>
cudaError_t launch(const void* w, int64_t rb, int64_t rows, int64_t cols, const __nv_bfloat16* xb, int64_t n,
                   float* out, int units_per_split, int split, cudaStream_t stream) {
  using C = Config<Q, BN>;
  if (const cudaError_t e = allow_dynamic_smem<gemm_q_kernel<Q, BN>>(C::kSmem); e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((n + BN - 1) / BN), static_cast<unsigned>((rows + kBM - 1) / kBM),
                  static_cast<unsigned>(split));
  gemm_q_kernel<Q, BN><<<grid, kThreads, C::kSmem, stream>>>(static_cast<const uint8_t*>(w), rb,
                                                             static_cast<int>(rows), cols, xb, static_cast<int>(n),
                                                             out, units_per_split);
  return cudaGetLastError();
}

template <class Q>
cudaError_t launch_bn(int bn, const void* w, int64_t rb, int64_t rows, int64_t cols, const __nv_bfloat16* xb,
                      int64_t n, float* out, int units_per_split, int split, cudaStream_t stream) {
  switch (bn) {
    case 64: return launch<Q, 64>(w, rb, rows, cols, xb, n, out, units_per_split, split, stream);
    case 128: return launch<Q, 128>(w, rb, rows, cols, xb, n, out, units_per_split, split, stream);
    default: return launch<Q, 256>(w, rb, rows, cols, xb, n, out, units_per_split, split, stream);
  }
}

}  // namespace

bool gemm_q_supported(DType type) { return known_type(type); }

bool gemm_q_applies(DType type, const void* w, int64_t rows, int64_t cols) {
  if (!known_type(type) || w == nullptr || rows < 1 || cols < 1 || cols % kUnit != 0) return false;
  if (rows > int64_t{65535} * kBM || cols > INT_MAX) return false;
  return is_aligned(w, kWeightAlign);
}

int gemm_q_effective_split(int64_t cols, const GemmQPlan& plan) {
  const int64_t units = cols / kUnit;
  if (units < 1) return 1;
  const int64_t split = plan.split < 1 ? 1 : (plan.split > units ? units : plan.split);
  const int64_t per = (units + split - 1) / split;
  return static_cast<int>((units + per - 1) / per);
}

size_t gemm_q_workspace_bytes(const GemmQPlan& plan, int64_t rows, int64_t cols, int64_t n) {
  const int split = gemm_q_effective_split(cols, plan);
  if (split <= 1 || rows <= 0 || n <= 0) return 0;
  return static_cast<size_t>(split) * static_cast<size_t>(rows) * static_cast<size_t>(n) * sizeof(float);
}

template <class Q>
constexpr int ctas_per_sm_64() {  // CTAs of BN = 64 that fit a multiprocessor's 228 KB of shared memory
  return 2 * (Config<Q, 64>::kSmem + 1024) <= 228 * 1024 ? 2 : 1;
}

GemmQPlan gemm_q_plan(DType type, int64_t rows, int64_t cols, int64_t n, int sms) {
  // A model of the kernel's time, its constants measured on an H100 (bench/cuda_matmul_bench.cpp, every
  // plan of the Qwen3-8B shapes at 32..1024 tokens): a CTA's time per k-step by type and tile width when
  // it has its multiprocessor alone (two CTAs of BN = 64 sharing one take 1.58 times as long each),
  // waves of CTAs, and for a split the partial sums written and added again (4 us + 1.5 GB/ms).
  struct Steps {
    double bn64, bn128, bn256;  // us a k-step
    int per_sm64;
  };
  Steps st{0.84, 1.03, 1.72, ctas_per_sm_64<GK4<false>>()};
  switch (static_cast<uint32_t>(type)) {
    case kQ5_K: st = {0.93, 1.07, 1.80, ctas_per_sm_64<GK4<true>>()}; break;
    case kQ6_K: st = {1.22, 1.60, 2.34, ctas_per_sm_64<GQ6K>()}; break;
    case kQ8_0: st = {1.28, 1.42, 2.15, ctas_per_sm_64<GQ80>()}; break;
    default: break;
  }
  constexpr double kPairSlowdown = 1.58, kReduceUs = 4.0, kReduceBytesPerUs = 1.5e6;
  if (sms < 1) sms = 1;
  const int64_t row_tiles = (rows + kBM - 1) / kBM, units = cols / kUnit;
  GemmQPlan best{128, 1};
  double best_us = 0;
  for (int bn : {64, 128, 256})
    for (int split = 1; split <= 16; split *= 2) {
      const GemmQPlan plan{bn, split};
      if (gemm_q_effective_split(cols, plan) != split) continue;
      const int64_t ctas = row_tiles * ((n + bn - 1) / bn) * split;
      const int per_sm = bn == 64 ? st.per_sm64 : 1;
      const int64_t waves = (ctas + int64_t{sms} * per_sm - 1) / (int64_t{sms} * per_sm);
      double step = bn == 64 ? st.bn64 : bn == 128 ? st.bn128 : st.bn256;
      if (per_sm == 2 && ctas > sms) step *= kPairSlowdown;
      const int64_t steps = 4 * ((units + split - 1) / split);
      double us = static_cast<double>(waves * steps) * step;
      if (split > 1) us += kReduceUs + static_cast<double>((split + 1) * n * rows * 4) / kReduceBytesPerUs;
      if (best_us == 0 || us < best_us) best_us = us, best = plan;
    }
  return best;
}

cudaError_t gemm_q(DType type, const void* w, int64_t rows, int64_t cols, const __nv_bfloat16* xb, int64_t n,
                   float* y, const GemmQPlan& plan, float* ws, cudaStream_t stream) {
  if (!gemm_q_applies(type, w, rows, cols) || n < 1 || n > INT_MAX || xb == nullptr || y == nullptr)
    return cudaErrorInvalidValue;
  if (!is_aligned(xb, 16) || (plan.bn != 64 && plan.bn != 128 && plan.bn != 256))
    return cudaErrorInvalidValue;
  if (static_cast<uint64_t>(n) * static_cast<uint64_t>(rows) > (uint64_t{1} << 62)) return cudaErrorInvalidValue;
  const int64_t units = cols / kUnit;
  const int split = gemm_q_effective_split(cols, plan);
  const int per = static_cast<int>((units + split - 1) / split);
  if (split > 1 && ws == nullptr) return cudaErrorInvalidValue;
  float* out = split > 1 ? ws : y;
  const int64_t rb = device_row_bytes(type, cols);  // weight_form.h
  if (rb <= 0) return cudaErrorInvalidValue;
  cudaError_t e = cudaErrorInvalidValue;
  switch (static_cast<uint32_t>(type)) {
    case kQ4_K: e = launch_bn<GK4<false>>(plan.bn, w, rb, rows, cols, xb, n, out, per, split, stream); break;
    case kQ5_K: e = launch_bn<GK4<true>>(plan.bn, w, rb, rows, cols, xb, n, out, per, split, stream); break;
    case kQ6_K: e = launch_bn<GQ6K>(plan.bn, w, rb, rows, cols, xb, n, out, per, split, stream); break;
    case kQ8_0: e = launch_bn<GQ80>(plan.bn, w, rb, rows, cols, xb, n, out, per, split, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (e != cudaSuccess || split <= 1) return e;
  const int64_t count = n * rows;
  const bool vec = count % 4 == 0 && is_aligned(ws, 16) && is_aligned(y, 16);
  const int64_t blocks = ((vec ? count / 4 : count) + 255) / 256;
  const auto grid = static_cast<unsigned>(blocks < 8192 ? blocks : 8192);
  if (vec)
    reduce_splits_kernel<true><<<grid, 256, 0, stream>>>(ws, split, count, y);
  else
    reduce_splits_kernel<false><<<grid, 256, 0, stream>>>(ws, split, count, y);
  return cudaGetLastError();
}

}  // namespace dflash::cuda
