#include "model/forward.h"

#include <cmath>
#include <cstring>
#include <string>

namespace dflash {
namespace {

std::string layer_name(int64_t layer, const char* part) { return "layers." + std::to_string(layer) + "." + part; }

Result<const cpu::WeightView*> need(const Weights& w, const std::string& name) {
  const cpu::WeightView* v = w.find(name);
  if (v == nullptr) return not_found("weights have no tensor '{}'", name);
  return v;
}
Result<const float*> need_f32(const Weights& w, const std::string& name) {
  const float* p = w.f32(name);
  if (p == nullptr) return not_found("weights have no f32 vector '{}'", name);
  return p;
}

double rope_freq_scale(const ModelSpec& s) {
  return s.rope_scaling.type == RopeScalingType::kLinear ? s.rope_scaling.factor : 1.0;
}

// Gated or plain attention (Qwen3.5 / Qwen3), algorithms.md D.3. xn [n, H] -> out [n, H].
Status attention_mixer(const Weights& w, int64_t L, const StepShape& st, const float* xn, float* out,
                       LayerStateAccess& state, ThreadPool& pool) {
  const ModelSpec& s = w.spec();
  const int64_t n = st.n, nh = s.n_heads, nkv = s.n_kv_heads, hd = s.head_dim;
  const bool gated = s.layer_kinds[static_cast<size_t>(L)] == LayerKind::kGatedAttention && s.attn_output_gate;
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wq, need(w, layer_name(L, "attn.q")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wk, need(w, layer_name(L, "attn.k")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wv, need(w, layer_name(L, "attn.v")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wo, need(w, layer_name(L, "attn.o")));
  DF_ASSIGN_OR_RETURN(const float* q_norm, need_f32(w, layer_name(L, "attn.q_norm")));
  DF_ASSIGN_OR_RETURN(const float* k_norm, need_f32(w, layer_name(L, "attn.k_norm")));

  std::vector<float> qg(static_cast<size_t>(n * wq->rows));
  DF_RETURN_IF_ERROR(cpu::matmul(*wq, xn, n, qg.data(), pool));
  std::vector<float> q(static_cast<size_t>(n * nh * hd)), gate;
  if (gated) {
    // Rows of attn.q are per head [q_h (hd) | gate_h (hd)].
    gate.resize(q.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const float* src = qg.data() + (t * nh + h) * 2 * hd;
        std::memcpy(q.data() + (t * nh + h) * hd, src, sizeof(float) * hd);
        std::memcpy(gate.data() + (t * nh + h) * hd, src + hd, sizeof(float) * hd);
      }
  } else {
    q = std::move(qg);
  }
  std::vector<float> k(static_cast<size_t>(n * nkv * hd)), v(k.size());
  DF_RETURN_IF_ERROR(cpu::matmul(*wk, xn, n, k.data(), pool));
  DF_RETURN_IF_ERROR(cpu::matmul(*wv, xn, n, v.data(), pool));
  const float eps = static_cast<float>(s.rms_eps);
  cpu::rms_norm(q.data(), q_norm, eps, n * nh, hd, q.data());
  cpu::rms_norm(k.data(), k_norm, eps, n * nkv, hd, k.data());
  const int64_t rot = s.rope_dims > 0 ? s.rope_dims : hd;
  cpu::rope_neox(q.data(), n, nh, hd, rot, st.positions, s.rope_theta, rope_freq_scale(s));
  cpu::rope_neox(k.data(), n, nkv, hd, rot, st.positions, s.rope_theta, rope_freq_scale(s));

  // New tokens take KV slots n_past .. n_past + n - 1 (tree nodes too: slot = node index).
  DF_RETURN_IF_ERROR(state.reserve_kv(L, st.n_past + n));
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(state.k_row(L, st.n_past + t), k.data() + t * nkv * hd, sizeof(float) * nkv * hd);
    std::memcpy(state.v_row(L, st.n_past + t), v.data() + t * nkv * hd, sizeof(float) * nkv * hd);
  }
  std::vector<float> o(q.size());
  cpu::AttentionMask mask{st.mask, st.n_past, st.parents};
  cpu::attention(q.data(), n, nh, state.kv_view(L, st.n_past + n), mask, 1.0f / std::sqrt(static_cast<float>(hd)),
                 o.data(), pool);
  if (gated) {
    cpu::sigmoid_inplace(gate.data(), static_cast<int64_t>(gate.size()));
    for (size_t i = 0; i < o.size(); ++i) o[i] *= gate[i];
  }
  return cpu::matmul(*wo, o.data(), n, out, pool);
}

// Gated DeltaNet mixer, algorithms.md D.4. xn [n, H] -> out [n, H].
Status deltanet_mixer(const Weights& w, int64_t L, const StepShape& st, const float* xn, float* out,
                      LayerStateAccess& state, ThreadPool& pool) {
  const ModelSpec& s = w.spec();
  const DeltaNetDims& g = s.gdn;
  const int64_t n = st.n, C = g.conv_dim(), Hk = g.n_k_heads, Hv = g.n_v_heads, dk = g.d_k, dv = g.d_v;
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wqkv, need(w, layer_name(L, "gdn.qkv")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wz, need(w, layer_name(L, "gdn.gate")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wb, need(w, layer_name(L, "gdn.beta")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wa, need(w, layer_name(L, "gdn.alpha")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wout, need(w, layer_name(L, "gdn.out")));
  DF_ASSIGN_OR_RETURN(const float* conv_w, need_f32(w, layer_name(L, "gdn.conv")));
  DF_ASSIGN_OR_RETURN(const float* dt_bias, need_f32(w, layer_name(L, "gdn.dt_bias")));
  DF_ASSIGN_OR_RETURN(const float* ssm_a, need_f32(w, layer_name(L, "gdn.ssm_a")));
  DF_ASSIGN_OR_RETURN(const float* norm_w, need_f32(w, layer_name(L, "gdn.norm")));

  std::vector<float> mixed(static_cast<size_t>(n * C)), z(static_cast<size_t>(n * Hv * dv));
  std::vector<float> b(static_cast<size_t>(n * Hv)), a(b.size());
  DF_RETURN_IF_ERROR(cpu::matmul(*wqkv, xn, n, mixed.data(), pool));
  DF_RETURN_IF_ERROR(cpu::matmul(*wz, xn, n, z.data(), pool));
  DF_RETURN_IF_ERROR(cpu::matmul(*wb, xn, n, b.data(), pool));
  DF_RETURN_IF_ERROR(cpu::matmul(*wa, xn, n, a.data(), pool));

  const bool capture = st.capture_recurrent || st.mask == cpu::MaskKind::kTree;
  if (capture) {
    // The window before the step, then this step's inputs: rollback to any prefix reads its window here.
    float* conv_cap = state.conv_capture(L, n);
    const int64_t window = (g.conv_kernel - 1) * C;
    std::memcpy(conv_cap, state.conv_state(L), sizeof(float) * window);
    std::memcpy(conv_cap + window, mixed.data(), sizeof(float) * n * C);
  }
  std::vector<float> u(mixed.size());
  cpu::causal_conv1d_silu(mixed.data(), n, C, conv_w, g.conv_kernel, state.conv_state(L), u.data(), st.parents);

  // Split [q | k | v], L2-normalise q and k per head (eps 1e-6), scale q by 1/sqrt(dk).
  std::vector<float> q(static_cast<size_t>(n * Hk * dk)), k(q.size()), v(static_cast<size_t>(n * Hv * dv));
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t t = 0; t < n; ++t) {
    const float* row = u.data() + t * C;
    std::memcpy(q.data() + t * Hk * dk, row, sizeof(float) * Hk * dk);
    std::memcpy(k.data() + t * Hk * dk, row + Hk * dk, sizeof(float) * Hk * dk);
    std::memcpy(v.data() + t * Hv * dv, row + 2 * Hk * dk, sizeof(float) * Hv * dv);
    for (int64_t h = 0; h < Hk; ++h) {
      for (float* x : {q.data() + (t * Hk + h) * dk, k.data() + (t * Hk + h) * dk}) {
        float ss = 0;
        for (int64_t i = 0; i < dk; ++i) ss += x[i] * x[i];
        const float inv = 1.0f / std::sqrt(ss + 1e-6f);
        for (int64_t i = 0; i < dk; ++i) x[i] *= inv;
      }
      float* qh = q.data() + (t * Hk + h) * dk;
      for (int64_t i = 0; i < dk; ++i) qh[i] *= q_scale;
    }
  }
  // beta = sigmoid(b); g = ssm_a * softplus(a + dt_bias) (ssm_a = -exp(A_log) <= 0).
  std::vector<float> decay(b.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      const size_t i = static_cast<size_t>(t * Hv + h);
      decay[i] = ssm_a[h] * cpu::softplus(a[i] + dt_bias[h]);
    }
  cpu::sigmoid_inplace(b.data(), static_cast<int64_t>(b.size()));

  std::vector<float> o(v.size());
  const cpu::DeltaNetShape shape{Hk, Hv, dk, dv};
  if (capture) {
    // Recurrent form: it yields the state after every token (tree nodes start from their parent's).
    cpu::gated_delta_net_recurrent(q.data(), k.data(), v.data(), decay.data(), b.data(), n, shape,
                                   state.ssm_state(L), o.data(), state.ssm_capture(L, n), st.parents, pool);
  } else if (n >= kChunkedDeltaNetMinTokens) {
    cpu::gated_delta_net_chunked(q.data(), k.data(), v.data(), decay.data(), b.data(), n, shape, state.ssm_state(L),
                                 o.data(), pool);
  } else {
    cpu::gated_delta_net_recurrent(q.data(), k.data(), v.data(), decay.data(), b.data(), n, shape, state.ssm_state(L),
                                   o.data(), nullptr, {}, pool);
  }
  // Gated output norm: RMSNorm over dv per (token, V-head), then * silu(z).
  cpu::rms_norm(o.data(), norm_w, static_cast<float>(s.rms_eps), n * Hv, dv, o.data());
  cpu::silu_inplace(z.data(), static_cast<int64_t>(z.size()));
  for (size_t i = 0; i < o.size(); ++i) o[i] *= z[i];
  return cpu::matmul(*wout, o.data(), n, out, pool);
}

// SwiGLU FFN on the normed stream: out [n, H] = down(silu(gate h) * up h).
Status mlp(const Weights& w, int64_t L, int64_t n, const float* hn, float* out, ThreadPool& pool) {
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wg, need(w, layer_name(L, "ffn.gate")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wu, need(w, layer_name(L, "ffn.up")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wd, need(w, layer_name(L, "ffn.down")));
  std::vector<float> gate(static_cast<size_t>(n * wg->rows)), up(gate.size());
  DF_RETURN_IF_ERROR(cpu::matmul(*wg, hn, n, gate.data(), pool));
  DF_RETURN_IF_ERROR(cpu::matmul(*wu, hn, n, up.data(), pool));
  cpu::swiglu(gate.data(), up.data(), gate.data(), static_cast<int64_t>(gate.size()));
  return cpu::matmul(*wd, gate.data(), n, out, pool);
}

}  // namespace

Status forward_layers(const Weights& w, int64_t begin, int64_t end, const StepShape& st, float* x,
                      LayerStateAccess& state, std::span<const int64_t> captures, std::span<float* const> captured,
                      ThreadPool& pool) {
  const ModelSpec& s = w.spec();
  if (begin < 0 || end > s.n_layers || begin > end)
    return invalid_argument("layer range [{}, {}) is outside the model's {} layers", begin, end, s.n_layers);
  if (static_cast<int64_t>(st.positions.size()) != st.n)
    return invalid_argument("{} positions for {} tokens", st.positions.size(), st.n);
  if (st.mask == cpu::MaskKind::kTree && static_cast<int64_t>(st.parents.size()) != st.n)
    return invalid_argument("tree step: {} parents for {} tokens", st.parents.size(), st.n);
  if (s.rope_scaling.type == RopeScalingType::kYarn) return unsupported("YaRN RoPE scaling is not implemented yet");
  if (captures.size() != captured.size()) return invalid_argument("capture layers and buffers differ in count");
  const int64_t n = st.n, H = s.hidden;
  const float eps = static_cast<float>(s.rms_eps);
  std::vector<float> xn(static_cast<size_t>(n * H)), delta(xn.size());
  for (int64_t L = begin; L < end; ++L) {
    DF_ASSIGN_OR_RETURN(const float* attn_norm, need_f32(w, layer_name(L, "attn_norm")));
    DF_ASSIGN_OR_RETURN(const float* ffn_norm, need_f32(w, layer_name(L, "ffn_norm")));
    cpu::rms_norm(x, attn_norm, eps, n, H, xn.data());
    if (s.is_recurrent(L)) DF_RETURN_IF_ERROR(deltanet_mixer(w, L, st, xn.data(), delta.data(), state, pool));
    else DF_RETURN_IF_ERROR(attention_mixer(w, L, st, xn.data(), delta.data(), state, pool));
    for (size_t i = 0; i < delta.size(); ++i) x[i] += delta[i];
    cpu::rms_norm(x, ffn_norm, eps, n, H, xn.data());
    DF_RETURN_IF_ERROR(mlp(w, L, n, xn.data(), delta.data(), pool));
    for (size_t i = 0; i < delta.size(); ++i) x[i] += delta[i];
    for (size_t c = 0; c < captures.size(); ++c)
      if (captures[c] == L) std::memcpy(captured[c], x, sizeof(float) * n * H);
  }
  return Status();
}

Status embed_tokens(const Weights& w, std::span<const int32_t> tokens, float* x) {
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* table, need(w, "token_embd"));
  return cpu::embedding_lookup(*table, tokens, x);
}

Status lm_head(const Weights& w, const float* x, std::span<const int64_t> rows, float* logits, ThreadPool& pool) {
  const ModelSpec& s = w.spec();
  DF_ASSIGN_OR_RETURN(const float* norm, need_f32(w, "output_norm"));
  const cpu::WeightView* head = w.find("output");
  if (head == nullptr) {
    DF_ASSIGN_OR_RETURN(head, need(w, "token_embd"));
  }
  std::vector<float> xn(rows.size() * static_cast<size_t>(s.hidden));
  for (size_t r = 0; r < rows.size(); ++r)
    cpu::rms_norm(x + rows[r] * s.hidden, norm, static_cast<float>(s.rms_eps), 1, s.hidden, xn.data() + r * s.hidden);
  return cpu::matmul(*head, xn.data(), static_cast<int64_t>(rows.size()), logits, pool);
}

}  // namespace dflash
