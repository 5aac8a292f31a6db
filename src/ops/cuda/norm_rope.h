// Device RMSNorm, partial NEOX RoPE and the elementwise ops of the forward (kernels in norm_rope.cu).
//
// Each function is the device twin of the ops/cpu/ops.h function of the same name and reproduces its
// float operations in the same order (no fused multiply-add where the CPU rounds twice):
//   rms_norm:     sum of squares in double, mean rounded to float, scale = 1 / sqrtf(mean + eps),
//                 y = (x * scale) * w. Bit-identical with the CPU except where the double sum, taken in
//                 another order, rounds to a different float mean (rare, 1 ulp of the scale).
//   rope_neox:    inv_freq and angle in double, cos/sin in double rounded to float, rotation in float
//                 (x0 * c - x1 * s, x0 * s + x1 * c, each product rounded). Bit-identical up to the
//                 rounding of the device's double cos/sin (within 1 ulp of float).
//   silu/sigmoid/swiglu: x / (1 + expf(-x)); expf is the device's (max 2 ulp), so within a few ulp.
//   softmax_rows: max-subtracted, expf, the sum in double, one float scale 1 / sum per row; a row that is
//                 all -inf becomes zeros.
//   add, mul:     out = a + b, out = a * b (the residual add and the gate multiply); exact.
//
// Pointers are device pointers; x and y (out and an input) may alias exactly (in place) but must not
// overlap otherwise. Every function enqueues on `stream` and returns the launch status
// (cudaErrorInvalidValue, nothing enqueued, for a negative size or a null pointer with work to do).
// Sizes of 0 are no-ops.
//
// This header is included by nvcc-compiled kernels: no base/status.h here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/gemv_q8.h"

namespace dflash::cuda {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w for n rows of `dim` (w null: no scale).
// Per-head use (the q/k norms, the DeltaNet output norm): n = tokens * heads rows of dim = head_dim.
// With q8 on (rms_norm_q8_supported(dim); xq 16-byte aligned), y's int8 form too, bit for bit what
// quantize_q8_rows makes of y, so the GEMV that reads y needs no quantize launch (as swiglu's). With q8.bf16()
// (the same widths), y's bf16 bits too (gemv_q8.h's Q8Out), on or off independently of the int8 form; every
// producer below takes q8.bf16() alike.
cudaError_t rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y,
                     cudaStream_t stream = nullptr, const Q8Out& q8 = Q8Out{});
// The rows rms_norm and add_rms_norm can write the int8 form of: dim a multiple of 32, at most 8192.
bool rms_norm_q8_supported(int64_t dim);
// The same with row strides (in floats): row r of x at x + r * x_stride, of y at y + r * y_stride
// (strides >= dim). For reading q out of the gated [q_h | gate_h] rows, x_stride = 2 * head_dim.
cudaError_t rms_norm_strided(const float* x, int64_t x_stride, const float* w, float eps, int64_t n, int64_t dim,
                             float* y, int64_t y_stride, cudaStream_t stream = nullptr);

// The DeltaNet output gate in one launch: o [rows, dim] = rms_norm(o, w) * silu(z) (dim <= kRmsNormSiluGateMaxDim;
// a warp a row, the norm as rms_norm's). With q8 on (dim a multiple of 32), o's int8 form too, as swiglu's.
inline constexpr int64_t kRmsNormSiluGateMaxDim = 1024;
cudaError_t rms_norm_silu_gate(float* o, const float* w, float eps, int64_t rows, int64_t dim, const float* z,
                               cudaStream_t stream = nullptr, const Q8Out& q8 = Q8Out{});
// The residual add fused with the next norm: x += delta (each sum rounded once, as add() does), then
// y = rms_norm(x) with weights w. x, delta [n, dim]; y must not alias x or delta. q8: as rms_norm's.
cudaError_t add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t n, int64_t dim, float* y,
                         cudaStream_t stream = nullptr, const Q8Out& q8 = Q8Out{});

// Attention input prep for n tokens in one launch: q [n, nh, hd] and k [n, nkv, hd] get RMSNorm over each
// head (weights q_norm / k_norm [hd]) then NEOX RoPE on their first rot dims at positions[t] (a device
// array; inv_freq: the host's table of rot / 2 frequencies, as rope_neox takes it); q is updated in
// place; k and v [n, nkv, hd] are stored in the KV store (attention.h's chunk tables) at slots first,
// first + 1, ... where first is *slot_dev when set (a replayed step's), else first_slot. Same math as
// rms_norm + rope_neox + kv_write.
struct QkPrepArgs {
  float* q;
  float* k;
  const float* v;
  int64_t n, nh, nkv, hd, rot;
  const float* q_norm;
  const float* k_norm;
  float eps;
  const double* inv_freq;
  const int32_t* positions;
  float* const* k_chunks;
  float* const* v_chunks;
  int64_t chunk_tokens;
  int64_t first_slot;
  const int32_t* slot_dev;
  bool kv_f16 = false;  // the chunks hold fp16 elements (written rounded to nearest even)
  int64_t q_from = 0;   // q holds the heads of tokens q_from.. only (q [n - q_from, nh, hd])
};
// Shapes the fused kernel takes: hd a multiple of 32 up to 256, rot a multiple of 64 (pairs within a lane).
bool qk_prep_supported(int64_t head_dim, int64_t rot_dims);
cudaError_t qk_prep(const QkPrepArgs& args, cudaStream_t stream = nullptr);

// x [n, n_heads, head_dim] in place: NEOX (rotate-half) RoPE on the first rot_dims dims of every head,
// pair (i, i + rot_dims / 2), angle = positions[t] * theta^(-2i / rot_dims) / freq_scale. `positions` is a
// device array of n int32. rot_dims must be even and <= head_dim (else cudaErrorInvalidValue);
// rot_dims == 0 is a no-op. inv_freq (optional): a device table of the rot_dims / 2 frequencies
// theta^(-2i / rot_dims) / freq_scale computed on the host as the CPU does (then theta and freq_scale are
// not used); without it the kernel forms them with the device's pow.
cudaError_t rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                      const int32_t* positions, double theta, double freq_scale = 1.0,
                      cudaStream_t stream = nullptr, const double* inv_freq = nullptr);

cudaError_t silu_inplace(float* x, int64_t n, cudaStream_t stream = nullptr);
cudaError_t sigmoid_inplace(float* x, int64_t n, cudaStream_t stream = nullptr);
// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
// With q8 on, out's int8 form (gemv_q8.h's Q8Out, bit-identical with quantize_q8_rows of out) is written
// too, so the down projection's GEMV needs no quantize launch; n must then be a multiple of 32
// (cudaErrorInvalidValue otherwise).
cudaError_t swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream = nullptr,
                   const Q8Out& q8 = Q8Out{});
// The gated attention's output gate in one launch: o [rows, dim] *= sigmoid(gate[r * gate_stride + d]),
// rounded as sigmoid_inplace then mul. With q8 on (dim a multiple of 32), o's int8 form too, as swiglu's.
cudaError_t sigmoid_gate_mul(float* o, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride,
                             cudaStream_t stream = nullptr, const Q8Out& q8 = Q8Out{});
// Softmax over each of n rows of `dim`, in place.
cudaError_t softmax_rows(float* x, int64_t n, int64_t dim, cudaStream_t stream = nullptr);
// out[i] = a[i] + b[i] (the residual add: add(x, delta, x, n)); out may alias a or b.
cudaError_t add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream = nullptr);
// out[i] = a[i] * b[i] (the output gate); out may alias a or b.
cudaError_t mul(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream = nullptr);

}  // namespace dflash::cuda
