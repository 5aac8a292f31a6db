#include "model/forward.h"

#include <cmath>
#include <cstring>
#include <string>

namespace dflash {

int64_t& chain_capture_min_floats() {
  static int64_t floats = kChainCaptureMinFloats;
  return floats;
}

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

// An attention layer's projections and q/k norms (every attention layer kind has the same six).
struct AttentionWeights {
  const cpu::WeightView *q, *k, *v, *o;
  const float *q_norm, *k_norm;
};
Result<AttentionWeights> attention_weights(const Weights& w, int64_t L) {
  AttentionWeights a{};
  DF_ASSIGN_OR_RETURN(a.q, need(w, layer_name(L, "attn.q")));
  DF_ASSIGN_OR_RETURN(a.k, need(w, layer_name(L, "attn.k")));
  DF_ASSIGN_OR_RETURN(a.v, need(w, layer_name(L, "attn.v")));
  DF_ASSIGN_OR_RETURN(a.o, need(w, layer_name(L, "attn.o")));
  DF_ASSIGN_OR_RETURN(a.q_norm, need_f32(w, layer_name(L, "attn.q_norm")));
  DF_ASSIGN_OR_RETURN(a.k_norm, need_f32(w, layer_name(L, "attn.k_norm")));
  return a;
}

// Gated or plain attention (Qwen3.5 / Qwen3), algorithms.md D.3. xn [n, H] -> out [n, H].
Status attention_mixer(const Weights& w, int64_t L, const StepShape& st, const float* xn, float* out,
                       LayerStateAccess& state, Backend& be) {
  const ModelSpec& s = w.spec();
  const int64_t n = st.n, nh = s.n_heads, nkv = s.n_kv_heads, hd = s.head_dim;
  const bool gated = s.layer_kinds[static_cast<size_t>(L)] == LayerKind::kGatedAttention && s.attn_output_gate;
  DF_ASSIGN_OR_RETURN(const AttentionWeights aw, attention_weights(w, L));
  const cpu::WeightView *wq = aw.q, *wk = aw.k, *wv = aw.v, *wo = aw.o;
  const float *q_norm = aw.q_norm, *k_norm = aw.k_norm;

  DF_ASSIGN_OR_RETURN(Buffer qg, be.alloc(n * wq->rows));
  DF_ASSIGN_OR_RETURN(Buffer k, be.alloc(n * nkv * hd));
  DF_ASSIGN_OR_RETURN(Buffer v, be.alloc(n * nkv * hd));
  {
    const cpu::WeightView* ws[] = {wq, wk, wv};
    float* ys[] = {qg.data(), k.data(), v.data()};
    DF_RETURN_IF_ERROR(be.matmul_group(ws, xn, n, ys));
  }
  // Plain attention uses the projection as q; gated rows of attn.q are per head [q_h (hd) | gate_h (hd)]:
  // viewed as [n * nh, 2 hd], split the columns.
  DF_ASSIGN_OR_RETURN(Buffer q_split, be.alloc(gated ? n * nh * hd : 0));
  float* q = gated ? q_split.data() : qg.data();
  if (gated) DF_RETURN_IF_ERROR(be.slice_columns(qg.data(), n * nh, 2 * hd, 0, hd, q));
  // q/k norms and RoPE; new tokens take KV slots n_past .. n_past + n - 1 (tree nodes too: slot = node index).
  const int64_t rot = s.rope_dims > 0 ? s.rope_dims : hd;
  DF_RETURN_IF_ERROR(state.reserve_kv(L, st.n_past + n));
  const cpu::KvView kv = state.kv_view(L, st.n_past + n);
  DF_RETURN_IF_ERROR(be.attention_prep(q, k.data(), v.data(), n, nh, nkv, hd, q_norm, k_norm,
                                       static_cast<float>(s.rms_eps), rot, st.positions, s.rope_theta,
                                       rope_freq_scale(s), kv, st.n_past, 0));
  DF_ASSIGN_OR_RETURN(Buffer o, be.alloc(n * nh * hd));
  cpu::AttentionMask mask{st.mask, st.n_past, st.parents};
  DF_RETURN_IF_ERROR(be.attention(q, n, nh, kv, mask, 1.0f / std::sqrt(static_cast<float>(hd)), o.data()));
  if (gated) DF_RETURN_IF_ERROR(be.sigmoid_gate_mul(o.data(), qg.data() + hd, n * nh, hd, 2 * hd));
  return be.matmul(*wo, o.data(), n, out);
}

Status no_capture_memory(int64_t layer) {
  return make_error(ErrorCode::kOutOfMemory, "DeltaNet layer {}: no memory for a verify step's capture", layer);
}

// Gated DeltaNet mixer, algorithms.md D.4. xn [n, H] -> out [n, H].
Status deltanet_mixer(const Weights& w, int64_t L, const StepShape& st, const float* xn, float* out,
                      LayerStateAccess& state, Backend& be) {
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

  const bool tree = st.mask == cpu::MaskKind::kTree;
  const bool capture = st.capture_recurrent || tree;
  // A captured causal step with large states keeps the state before it and its recurrent inputs (q, k, v,
  // decay, beta: the buffers below are the capture's own), so that a rollback re-runs the kept tokens; other
  // captured steps keep every token's state (a tree's nodes start from their parent's).
  float* chain = nullptr;
  const ChainCapture cc = chain_capture_layout(g, n);
  if (capture && !tree && chain_capture_pays(g, n)) {
    chain = state.ssm_chain_capture(L, n);
    if (chain == nullptr) return no_capture_memory(L);
  }
  auto own = [&](int64_t elems) { return be.alloc(chain != nullptr ? 0 : elems); };
  DF_ASSIGN_OR_RETURN(Buffer mixed, be.alloc(n * C));
  DF_ASSIGN_OR_RETURN(Buffer z, be.alloc(n * Hv * dv));
  DF_ASSIGN_OR_RETURN(Buffer b_own, own(n * Hv));
  DF_ASSIGN_OR_RETURN(Buffer a_own, own(n * Hv));
  float* b = chain != nullptr ? chain + cc.beta : b_own.data();
  float* a = chain != nullptr ? chain + cc.decay : a_own.data();
  {
    const cpu::WeightView* ws[] = {wqkv, wz, wb, wa};
    float* ys[] = {mixed.data(), z.data(), b, a};
    DF_RETURN_IF_ERROR(be.matmul_group(ws, xn, n, ys));
  }

  // A captured step keeps the window before it, then its inputs (deltanet_prep writes them): rollback to any
  // prefix reads its window there.
  float* conv_cap = nullptr;
  if (capture) {
    conv_cap = state.conv_capture(L, n);
    if (conv_cap == nullptr) return no_capture_memory(L);
  }
  // Conv + SiLU, split [q | k | v], L2-normalise q and k per head (eps 1e-6), scale q by 1/sqrt(dk); the gates:
  // a -> decay = ssm_a * softplus(a + dt_bias) (ssm_a = -exp(A_log) <= 0), b -> beta = sigmoid(b).
  const cpu::DeltaNetShape shape{Hk, Hv, dk, dv};
  DF_ASSIGN_OR_RETURN(Buffer q_own, own(n * Hk * dk));
  DF_ASSIGN_OR_RETURN(Buffer k_own, own(n * Hk * dk));
  DF_ASSIGN_OR_RETURN(Buffer v_own, own(n * Hv * dv));
  float* q = chain != nullptr ? chain + cc.q : q_own.data();
  float* k = chain != nullptr ? chain + cc.k : k_own.data();
  float* v = chain != nullptr ? chain + cc.v : v_own.data();
  DF_RETURN_IF_ERROR(be.deltanet_prep(mixed.data(), n, shape, conv_w, g.conv_kernel, state.conv_state(L), st.parents,
                                      q, k, v, a, b, dt_bias, ssm_a, conv_cap));

  DF_ASSIGN_OR_RETURN(Buffer o, be.alloc(n * Hv * dv));
  // Captured steps run the recurrent form (what a rollback re-runs, and a tree's per-node states need).
  const bool chunked = !capture && n >= kChunkedDeltaNetMinTokens;
  float* node_states = nullptr;
  if (capture && chain == nullptr) {
    node_states = state.ssm_capture(L, n);
    if (node_states == nullptr) return no_capture_memory(L);
  }
  // A chain capture keeps the state before the step (the kernel stores it as it loads it).
  DF_RETURN_IF_ERROR(be.gated_delta_net(q, k, v, a, b, n, shape, state.ssm_state(L), o.data(), node_states,
                                        st.parents, chunked, chain != nullptr ? chain + cc.state : nullptr));
  // Gated output norm: RMSNorm over dv per (token, V-head), then * silu(z).
  DF_RETURN_IF_ERROR(be.rms_norm_silu_gate(o.data(), norm_w, static_cast<float>(s.rms_eps), n * Hv, dv, z.data()));
  return be.matmul(*wout, o.data(), n, out);
}

// SwiGLU FFN on the normed stream: out [n, H] = down(silu(gate h) * up h).
Status mlp(const Weights& w, int64_t L, int64_t n, const float* hn, float* out, Backend& be) {
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wg, need(w, layer_name(L, "ffn.gate")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wu, need(w, layer_name(L, "ffn.up")));
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* wd, need(w, layer_name(L, "ffn.down")));
  DF_ASSIGN_OR_RETURN(Buffer gate, be.alloc(n * wg->rows));
  DF_ASSIGN_OR_RETURN(Buffer up, be.alloc(n * wu->rows));
  DF_RETURN_IF_ERROR(be.matmul_swiglu(*wg, *wu, hn, n, gate.data(), up.data()));
  return be.matmul(*wd, gate.data(), n, out);
}

}  // namespace

Status forward_layers(const Weights& w, int64_t begin, int64_t end, const StepShape& st, float* x,
                      LayerStateAccess& state, std::span<const int64_t> captures, std::span<float* const> captured,
                      Backend& be) {
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
  DF_ASSIGN_OR_RETURN(Buffer xn, be.alloc(n * H));
  DF_ASSIGN_OR_RETURN(Buffer delta, be.alloc(n * H));
  // Each residual add is fused with the norm that follows it (the next layer's attention norm too), also after
  // a layer whose output is captured: the fused add stores x, and the capture copies it from there.
  auto capture = [&](int64_t L) -> Status {
    for (size_t c = 0; c < captures.size(); ++c)
      if (captures[c] == L) DF_RETURN_IF_ERROR(be.copy(captured[c], x, n * H));
    return Status();
  };
  bool pending = false;  // delta holds the previous layer's MLP output, not yet added to x
  for (int64_t L = begin; L < end; ++L) {
    DF_ASSIGN_OR_RETURN(const float* attn_norm, need_f32(w, layer_name(L, "attn_norm")));
    DF_ASSIGN_OR_RETURN(const float* ffn_norm, need_f32(w, layer_name(L, "ffn_norm")));
    if (pending) {
      DF_RETURN_IF_ERROR(be.add_rms_norm(x, delta.data(), attn_norm, eps, n, H, xn.data()));
      DF_RETURN_IF_ERROR(capture(L - 1));  // x is layer L - 1's output now
    } else {
      DF_RETURN_IF_ERROR(be.rms_norm(x, attn_norm, eps, n, H, xn.data()));
    }
    if (s.is_recurrent(L)) DF_RETURN_IF_ERROR(deltanet_mixer(w, L, st, xn.data(), delta.data(), state, be));
    else DF_RETURN_IF_ERROR(attention_mixer(w, L, st, xn.data(), delta.data(), state, be));
    DF_RETURN_IF_ERROR(be.add_rms_norm(x, delta.data(), ffn_norm, eps, n, H, xn.data()));
    DF_RETURN_IF_ERROR(mlp(w, L, n, xn.data(), delta.data(), be));
    pending = true;
  }
  if (pending) {  // the range's output itself
    DF_RETURN_IF_ERROR(be.add_inplace(x, delta.data(), n * H));
    DF_RETURN_IF_ERROR(capture(end - 1));
  }
  return Status();
}

Status embed_tokens(const Weights& w, std::span<const int32_t> tokens, float* x, Backend& be) {
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* table, need(w, "token_embd"));
  return be.embedding(*table, tokens, x);
}

namespace {

// Final norm `norm_from`'s output_norm, then `head_from`'s LM head (its `output`, or the tied embedding).
Status normed_head(const Weights& norm_from, const Weights& head_from, const float* x, std::span<const int64_t> rows,
                   float* logits, Backend& be) {
  const ModelSpec& s = norm_from.spec();
  DF_ASSIGN_OR_RETURN(const float* norm, need_f32(norm_from, "output_norm"));
  const cpu::WeightView* head = head_from.find("output");
  if (head == nullptr) {
    DF_ASSIGN_OR_RETURN(head, need(head_from, "token_embd"));
  }
  const int64_t m = static_cast<int64_t>(rows.size());
  DF_ASSIGN_OR_RETURN(Buffer xn, be.alloc(m * s.hidden));
  // Consecutive rows (every step's usual case: the last row, a block, a verify's tokens) are normed where they lie;
  // others are gathered first.
  const bool consecutive = consecutive_rows(rows);
  const float* from = x + (consecutive ? rows[0] * s.hidden : 0);
  if (!consecutive) {
    DF_RETURN_IF_ERROR(be.gather_rows(x, s.hidden, rows, xn.data()));
    from = xn.data();
  }
  DF_RETURN_IF_ERROR(be.rms_norm(from, norm, static_cast<float>(s.rms_eps), m, s.hidden, xn.data()));
  return be.matmul(*head, xn.data(), m, logits);
}

// One draft layer's attention (algorithms.md A.3). z [n_new + B, H]: the context rows, then the block's normed
// rows (xn = z + n_new * H). out [B, H].
Status draft_attention(const Weights& w, int64_t L, const float* z, int64_t n_new, int64_t B, int64_t first_slot,
                       std::span<const int32_t> positions, float* out, LayerStateAccess& state, Backend& be) {
  const ModelSpec& s = w.spec();
  const int64_t nh = s.n_heads, nkv = s.n_kv_heads, hd = s.head_dim, rows = n_new + B;
  const float eps = static_cast<float>(s.rms_eps);
  DF_ASSIGN_OR_RETURN(const AttentionWeights aw, attention_weights(w, L));
  const cpu::WeightView *wq = aw.q, *wk = aw.k, *wv = aw.v, *wo = aw.o;
  const float *q_norm = aw.q_norm, *k_norm = aw.k_norm;
  // Queries of the block only; keys and values of the context and the block (one product each).
  DF_ASSIGN_OR_RETURN(Buffer q, be.alloc(B * nh * hd));
  DF_ASSIGN_OR_RETURN(Buffer k, be.alloc(rows * nkv * hd));
  DF_ASSIGN_OR_RETURN(Buffer v, be.alloc(rows * nkv * hd));
  DF_RETURN_IF_ERROR(be.matmul(*wq, z + n_new * s.hidden, B, q.data()));
  {
    const cpu::WeightView* ws[] = {wk, wv};
    float* ys[] = {k.data(), v.data()};
    DF_RETURN_IF_ERROR(be.matmul_group(ws, z, rows, ys));
  }
  const int64_t rot = s.rope_dims > 0 ? s.rope_dims : hd;
  const double freq_scale = rope_freq_scale(s);
  // q/k norms, RoPE and the new K/V rows (the block's queries are tokens n_new.. of the rows): one launch on a
  // device backend.
  const int64_t n_total = first_slot + rows;
  DF_RETURN_IF_ERROR(state.reserve_kv(L, n_total));
  const cpu::KvView kv = state.kv_view(L, n_total);
  DF_RETURN_IF_ERROR(be.attention_prep(q.data(), k.data(), v.data(), rows, nh, nkv, hd, q_norm, k_norm, eps, rot,
                                       positions, s.rope_theta, freq_scale, kv, first_slot, n_new));
  DF_ASSIGN_OR_RETURN(Buffer o, be.alloc(B * nh * hd));
  // Full layers: the block sees every context slot and itself both ways. Sliding-window layers (A.3): causal
  // inside the block and the last `window` positions up to each query's own.
  const int64_t window = s.sliding_window.empty() ? 0 : s.sliding_window[static_cast<size_t>(L)];
  const cpu::AttentionMask mask{window > 0 ? cpu::MaskKind::kCausal : cpu::MaskKind::kFull, first_slot + n_new, {}, window};
  DF_RETURN_IF_ERROR(be.attention(q.data(), B, nh, kv, mask, 1.0f / std::sqrt(static_cast<float>(hd)), o.data()));
  return be.matmul(*wo, o.data(), B, out);
}

}  // namespace

Status lm_head(const Weights& w, const float* x, std::span<const int64_t> rows, float* logits, Backend& be) {
  return normed_head(w, w, x, rows, logits, be);
}

Status draft_context(const Weights& draft, const float* features, int64_t n, float* ctx, Backend& be) {
  const ModelSpec& s = draft.spec();
  if (s.family != ModelFamily::kDFlashDraft) return invalid_argument("draft_context needs a DFlash draft");
  DF_ASSIGN_OR_RETURN(const cpu::WeightView* fc, need(draft, "fc"));
  DF_ASSIGN_OR_RETURN(const float* hidden_norm, need_f32(draft, "hidden_norm"));
  if (n == 0) return Status();
  DF_RETURN_IF_ERROR(be.matmul(*fc, features, n, ctx));
  return be.rms_norm(ctx, hidden_norm, static_cast<float>(s.rms_eps), n, s.hidden, ctx);
}

Status draft_layers(const Weights& draft, const float* ctx, int64_t n_new, int64_t first_slot,
                    std::span<const int32_t> positions, float* x, int64_t B, LayerStateAccess& state, Backend& be) {
  const ModelSpec& s = draft.spec();
  if (s.family != ModelFamily::kDFlashDraft) return invalid_argument("draft_layers needs a DFlash draft");
  if (n_new < 0 || first_slot < 0 || B < 1 || static_cast<int64_t>(positions.size()) != n_new + B)
    return invalid_argument("draft step: {} context rows at slot {}, block of {}, {} positions", n_new, first_slot, B,
                            positions.size());
  if (s.rope_scaling.type == RopeScalingType::kYarn) return unsupported("YaRN RoPE scaling is not implemented yet");
  const int64_t H = s.hidden, rows = n_new + B;
  const float eps = static_cast<float>(s.rms_eps);
  // z = [context rows ; the block's normed rows]; the context part is the same for every layer.
  DF_ASSIGN_OR_RETURN(Buffer z, be.alloc(rows * H));
  if (n_new > 0) DF_RETURN_IF_ERROR(be.copy(z.data(), ctx, n_new * H));
  float* xn = z.data() + n_new * H;
  DF_ASSIGN_OR_RETURN(Buffer delta, be.alloc(B * H));
  DF_ASSIGN_OR_RETURN(Buffer hn, be.alloc(B * H));
  for (int64_t L = 0; L < s.n_layers; ++L) {
    DF_ASSIGN_OR_RETURN(const float* attn_norm, need_f32(draft, layer_name(L, "attn_norm")));
    DF_ASSIGN_OR_RETURN(const float* ffn_norm, need_f32(draft, layer_name(L, "ffn_norm")));
    // The previous layer's residual add fused with this layer's norm (as the target's layers do).
    if (L > 0) DF_RETURN_IF_ERROR(be.add_rms_norm(x, delta.data(), attn_norm, eps, B, H, xn));
    else DF_RETURN_IF_ERROR(be.rms_norm(x, attn_norm, eps, B, H, xn));
    DF_RETURN_IF_ERROR(draft_attention(draft, L, z.data(), n_new, B, first_slot, positions, delta.data(), state, be));
    DF_RETURN_IF_ERROR(be.add_rms_norm(x, delta.data(), ffn_norm, eps, B, H, hn.data()));
    DF_RETURN_IF_ERROR(mlp(draft, L, B, hn.data(), delta.data(), be));
  }
  if (s.n_layers > 0) DF_RETURN_IF_ERROR(be.add_inplace(x, delta.data(), B * H));
  return Status();
}

Status draft_head(const Weights& draft, const Weights& target, const float* x, std::span<const int64_t> rows,
                  float* logits, Backend& be) {
  if (draft.spec().hidden != target.spec().hidden)
    return invalid_argument("draft hidden size {} differs from the target's {}", draft.spec().hidden, target.spec().hidden);
  return normed_head(draft, target, x, rows, logits, be);
}

}  // namespace dflash
