// Canonical tensor names and the one map between them, GGUF names and HF names (qwen3, qwen35, DFlash
// drafts), with the transforms the HF -> GGUF conversion applies. The converter and the weight loaders
// both use this map; nothing else spells file tensor names.
//
// Canonical scheme (no ".weight" suffix; shapes row-major [out, in] as HF stores them; GGUF/ggml
// lists the same dims innermost first, {in, out}):
//   token_embd                      [V, H]        embedding table
//   output_norm                     [H]           final RMSNorm
//   output                          [V, H]        LM head; absent when embeddings are tied
//   layers.<i>.attn_norm            [H]           pre-mixer RMSNorm (every layer, GDN ones too)
//   layers.<i>.ffn_norm             [H]           pre-FFN RMSNorm (HF post_attention_layernorm)
//   layers.<i>.attn.q               [nh*hd, H]    qwen35 gated attention: [2*nh*hd, H], per head [q_h | gate_h]
//   layers.<i>.attn.k / attn.v      [nkv*hd, H]
//   layers.<i>.attn.o               [H, nh*hd]
//   layers.<i>.attn.q_norm / k_norm [hd]          per-head RMSNorm
//   layers.<i>.ffn.gate / ffn.up    [F, H]        SwiGLU
//   layers.<i>.ffn.down             [H, F]
//   layers.<i>.gdn.qkv              [2*Hk*dk + Hv*dv, H]  Gated DeltaNet in_proj_qkv: [q | k | v]
//   layers.<i>.gdn.gate             [Hv*dv, H]    in_proj_z (output gate)
//   layers.<i>.gdn.beta             [Hv, H]       in_proj_b
//   layers.<i>.gdn.alpha            [Hv, H]       in_proj_a
//   layers.<i>.gdn.conv             [conv_dim, K] depthwise causal conv (HF stores [conv_dim, 1, K])
//   layers.<i>.gdn.dt_bias          [Hv]
//   layers.<i>.gdn.ssm_a            [Hv]          -exp(A_log) (HF stores A_log)
//   layers.<i>.gdn.norm             [dv]          gated output RMSNorm (plain, never zero-centred)
//   layers.<i>.gdn.out              [H, Hv*dv]    out_proj
//   mtp.fc                          [H, 2H]       MTP input projection of [embedding ; hidden]
//   mtp.enorm / mtp.hnorm           [H]           MTP norms of the embedding / the trunk hidden state
//   mtp.output_norm                 [H]           MTP final norm (GGUF nextn.shared_head_norm)
//   mtp.layers.<j>.<part>                         MTP decoder layer j: the attention-layer parts above
//   fc                              [H, m*H]      DFlash draft: fuses the m captured target features
//   hidden_norm                     [H]           DFlash draft: RMSNorm after fc
// Draft layers use layers.<i>.{attn_norm, ffn_norm, attn.*, ffn.*}; a draft has no token_embd/output.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

enum class NameFamily { kQwen3, kQwen35, kDFlashDraft };

// What the map needs to know about a model (model/model_spec.h builds it from a ModelSpec).
struct TensorNameLayout {
  NameFamily family = NameFamily::kQwen3;
  std::vector<bool> recurrent;  // per trunk layer: Gated DeltaNet (true) or attention; size = n_layers
  int n_mtp_layers = 0;         // qwen35 MTP layers (GGUF blk.<n_layers + j>)
  bool hf_vl_wrapper = false;   // HF names under model.language_model.* (Qwen3_5ForConditionalGeneration)
  bool tied_embeddings = false; // no `output` tensor
};

// Transforms from the HF tensor to the GGUF tensor (bit flags). Loaders of HF weights apply the
// same ones to reach canonical values.
enum HfTransform : uint32_t {
  kHfNone = 0,
  kHfNormPlusOne = 1u << 0,  // zero-centred RMSNorm weight: value + 1 (qwen35 trunk and MTP norms)
  kHfNegExp = 1u << 1,       // A_log -> -exp(A_log)
  kHfSqueeze = 1u << 2,      // drop unit dims (conv1d [conv_dim, 1, K] -> [conv_dim, K])
  // V-head reorder from HF's grouped order (V-heads of K-head 0 first) to GGUF's tiled order (V-head 0
  // of every K-head first); a no-op when n_v_heads == n_k_heads (algorithms.md D.8).
  kHfVHeadRows = 1u << 3,       // all rows, grouped by V-head (in_proj_z, in_proj_a/b, A_log, dt_bias)
  kHfVHeadRowsAfterQK = 1u << 4,  // only rows past 2*Hk*dk (the v part of in_proj_qkv and of conv1d)
  kHfVHeadCols = 1u << 5,       // input columns (out_proj)
};

struct TensorNameEntry {
  std::string canonical;
  std::string gguf;          // full GGUF name ("blk.3.attn_q.weight"); "" when GGUF has none
  std::string hf;            // full HF name in the layout's spelling; "" when HF has none
  uint32_t hf_to_gguf = kHfNone;  // HfTransform bits
  int layer = -1;            // trunk layer index, or -1 (globals, MTP)
};

class TensorNameMap {
 public:
  explicit TensorNameMap(const TensorNameLayout& layout);

  const TensorNameLayout& layout() const { return layout_; }
  // Every tensor the model has, globals first, then layer by layer.
  const std::vector<TensorNameEntry>& entries() const { return entries_; }

  const TensorNameEntry* by_canonical(std::string_view name) const;
  const TensorNameEntry* by_gguf(std::string_view name) const;
  // Accepts both HF spellings of trunk names (model.* and model.language_model.*), "model.mtp.*" for
  // "mtp.*", and draft names with or without a "model." prefix.
  const TensorNameEntry* by_hf(std::string_view name) const;

 private:
  void add(TensorNameEntry e);
  std::string normalize_hf(std::string_view name) const;

  TensorNameLayout layout_;
  std::vector<TensorNameEntry> entries_;
  std::map<std::string, size_t, std::less<>> canonical_;
  std::map<std::string, size_t, std::less<>> gguf_;
  std::map<std::string, size_t, std::less<>> hf_;  // normalized HF names
};

// HF tensors of the vision tower and other parts dflash does not load (model.visual.*, ...).
bool hf_tensor_is_vision(std::string_view hf_name);

}  // namespace dflash
