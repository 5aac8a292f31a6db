// The f16 tensor-core pieces of the attention kernels (attention_mma.cu, attention_decode_mma.cu), and the bf16
// mma.sync and packing of gemm_q.cu and gemv16_mma.cu:
// mma.sync m16n8k16 with f16 inputs and f32 accumulators, ldmatrix loads of its fragments from shared memory,
// f16 packing, the fast base-2 exponential, and a warp's steps of one K/V tile for its 16 rows (Q K^T, the
// online softmax, P V), FlashAttention-2 style: a thread holds rows a = lane / 4 and b = a + 8 of the tile's
// C fragments, the 4 threads of a quad share a row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace dflash::cuda {

__device__ __forceinline__ float fast_exp2(float x) {  // 2^x; 2^-inf = 0, results below 2^-126 flush to 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);  // a in the low half
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// Two floats to a bf16 pair (a in the low half), rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// c += a b: m16n8k16, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a b: m16n8k16, f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// S = Q K^T for a warp's 16 rows and BN keys (C fragments: s[n] is keys 8 n .. 8 n + 7): Q's A fragments at
// q_addr, K's rows (ld halves apart, keys in order) at k_addr, both shared-memory addresses advancing 16
// halves a k-step (the ldmatrix lane offsets already applied).
template <int HD, int BN>
__device__ __forceinline__ void qk_tile(float (&s)[BN / 8][4], uint32_t q_addr, uint32_t k_addr, int ld) {
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ++ks) {
    uint32_t a[4];
    ldsm_x4(q_addr + 32u * ks, a[0], a[1], a[2], a[3]);
#pragma unroll
    for (int np = 0; np < BN / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(k_addr + 2u * (np * 16 * ld) + 32u * ks, b0, b1, b2, b3);
      mma16816(s[2 * np], a, b0, b1);
      mma16816(s[2 * np + 1], a, b2, b3);
    }
  }
}

// The online softmax of a tile's scores s (base-2 units, -inf where masked) for the thread's rows a and b:
// running max m, correction 2^(m_old - m_new) applied to O and to the running sum l (a per-thread partial,
// summed over the quad at the end), and s becomes p = 2^(s - m_new). A row that has seen no key keeps
// m = -inf (every p and its correction are 0); the correction is exactly 1 when a row's max does not move, so a
// tile a row sees none of leaves its (m, l, O) as they were, bit for bit.
template <int HD, int BN>
__device__ __forceinline__ void online_softmax(float (&s)[BN / 8][4], float& m_a, float& m_b, float& l_a, float& l_b,
                                               float (&o)[HD / 8][4]) {
  float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) {
    mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
    mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
  }
#pragma unroll
  for (int w = 1; w <= 2; w <<= 1) {
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, w));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, w));
  }
  const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
  const float base_a = mn_a == -INFINITY ? 0.0f : mn_a, base_b = mn_b == -INFINITY ? 0.0f : mn_b;
  const float corr_a = m_a == mn_a ? 1.0f : fast_exp2(m_a - base_a);
  const float corr_b = m_b == mn_b ? 1.0f : fast_exp2(m_b - base_b);
  m_a = mn_a;
  m_b = mn_b;
  float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
  for (int n = 0; n < BN / 8; ++n) {
    s[n][0] = fast_exp2(s[n][0] - base_a);
    s[n][1] = fast_exp2(s[n][1] - base_a);
    s[n][2] = fast_exp2(s[n][2] - base_b);
    s[n][3] = fast_exp2(s[n][3] - base_b);
    sum_a += s[n][0] + s[n][1];
    sum_b += s[n][2] + s[n][3];
  }
  l_a = l_a * corr_a + sum_a;
  l_b = l_b * corr_b + sum_b;
  // O's correction, unless no row of the warp's moved its max (a product by exactly 1 changes nothing): past a
  // row's first tiles most do not, and at BN 16 the HD / 2 products a thread are a tile's largest single part.
  if (!__any_sync(0xffffffffu, corr_a != 1.0f || corr_b != 1.0f)) return;
#pragma unroll
  for (int d = 0; d < HD / 8; ++d) {
    o[d][0] *= corr_a;
    o[d][1] *= corr_a;
    o[d][2] *= corr_b;
    o[d][3] *= corr_b;
  }
}

// O += P V: P rounded to f16 straight from the S accumulators (the C layout of two n8 tiles is the A layout of
// one k16 step), V's B fragments by ldmatrix.trans from its rows (ld halves apart) at v_addr.
template <int HD, int BN>
__device__ __forceinline__ void pv_tile(const float (&p)[BN / 8][4], float (&o)[HD / 8][4], uint32_t v_addr, int ld) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    const uint32_t a[4] = {pack_half2(p[2 * kk][0], p[2 * kk][1]), pack_half2(p[2 * kk][2], p[2 * kk][3]),
                           pack_half2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           pack_half2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < HD / 16; ++dp) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_t(v_addr + 2u * (kk * 16 * ld) + 32u * dp, b0, b1, b2, b3);
      mma16816(o[2 * dp], a, b0, b1);
      mma16816(o[2 * dp + 1], a, b2, b3);
    }
  }
}

// A row's result from the thread's columns 8 d + 2 qc + {0, 1} of its unnormalised O (max m in base-2 units,
// sum l): O / l (0 for a row that saw no key) when the keys are not split, else split `split`'s partial (O, m in
// natural units, l) that attention.cu's merge_kernel combines. `row` indexes the call's n_rows (query, head)
// rows.
template <int HD>
__device__ __forceinline__ void store_row(const float (&o)[HD / 8][2], float m, float l, int64_t row, int qc,
                                          int split, int n_splits, int64_t n_rows, float* out, float* part_acc,
                                          float* part_ml) {
  if (n_splits == 1) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* dst = out + row * HD + 2 * qc;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
      *reinterpret_cast<float2*>(dst + 8 * d) = make_float2(o[d][0] * inv, o[d][1] * inv);
  } else {
    const int64_t prow = split * n_rows + row;
    float* dst = part_acc + prow * HD + 2 * qc;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) *reinterpret_cast<float2*>(dst + 8 * d) = make_float2(o[d][0], o[d][1]);
    if (qc == 0) {
      part_ml[2 * prow] = m * 0.69314718055994531f;  // -inf stays -inf
      part_ml[2 * prow + 1] = l;
    }
  }
}

}  // namespace dflash::cuda
