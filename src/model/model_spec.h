// ModelSpec: the one canonical description of every supported model family (a configuration, not a
// class per family), built from HF config.json or GGUF metadata, and written back to GGUF metadata.
//
// Dimension letters: H hidden, F FFN inner, V vocab, nh query heads, nkv KV heads, hd head dim,
// Hk/Hv Gated DeltaNet key/value heads, dk/dv their head dims, K conv kernel, L trunk layers.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "formats/gguf.h"
#include "formats/hf_config.h"
#include "formats/tensor_names.h"

namespace dflash {

enum class ModelFamily {
  kQwen3,        // dense Qwen3: every layer attention (GGUF arch "qwen3")
  kQwen35,       // Qwen3.5/3.6 dense hybrid: 3 Gated DeltaNet : 1 gated attention (GGUF arch "qwen35")
  kDFlashDraft,  // DFlash block-diffusion draft (algorithms.md A.1; GGUF arch "dflash")
};
const char* model_family_name(ModelFamily f);  // "qwen3", "qwen35", "dflash-draft"

enum class LayerKind {
  kAttention,       // Qwen3: RoPE'd GQA with per-head q/k RMSNorm
  kGatedAttention,  // Qwen3.5: as above, partial RoPE, q_proj also yields a sigmoid output gate
  kGatedDeltaNet,   // Qwen3.5 linear attention: conv + delta-rule recurrence (algorithms.md D.4)
  kDraftAttention,  // DFlash draft: block queries over injected target context + the block itself
};
const char* layer_kind_name(LayerKind k);

enum class RopeScalingType { kNone, kLinear, kYarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;             // context extension factor (positions are divided by it for linear)
  int64_t original_context = 0;    // yarn: training context length
  std::optional<double> attn_factor;  // yarn attention (mscale) factor override
  std::optional<double> beta_fast;    // yarn ramp bounds (HF defaults 32 / 1 when absent)
  std::optional<double> beta_slow;
  bool operator==(const RopeScaling&) const = default;
};

// Order of the Gated DeltaNet V-heads in the weights (only matters when Hv != Hk).
enum class VHeadOrder {
  kGrouped,  // HF: V-heads grouped by K-head; V-head h reads K-head h / (Hv/Hk)  (repeat-interleave)
  kTiled,    // GGUF: V-head h reads K-head h % Hk (tile-repeat)
};

struct DeltaNetDims {
  int64_t n_k_heads = 0;    // Hk (linear_num_key_heads, GGUF ssm.group_count)
  int64_t n_v_heads = 0;    // Hv (linear_num_value_heads, GGUF ssm.time_step_rank); multiple of Hk
  int64_t d_k = 0;          // dk (linear_key_head_dim, GGUF ssm.state_size)
  int64_t d_v = 0;          // dv (linear_value_head_dim; GGUF ssm.inner_size / time_step_rank)
  int64_t conv_kernel = 0;  // K (linear_conv_kernel_dim, GGUF ssm.conv_kernel)
  int64_t key_dim() const { return n_k_heads * d_k; }            // Hk*dk
  int64_t value_dim() const { return n_v_heads * d_v; }          // Hv*dv
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels of qkv and the conv
  int64_t state_floats() const { return n_v_heads * d_v * d_k; }    // the recurrent state S [Hv, dv, dk]
  bool operator==(const DeltaNetDims&) const = default;
};

struct ModelSpec {
  ModelFamily family = ModelFamily::kQwen3;

  // ---- sizes
  int64_t n_layers = 0;      // L trunk decoder layers (MTP layers not included)
  int64_t n_mtp_layers = 0;  // MTP/nextn layers after the trunk (qwen35 exports 1; 0 = none kept)
  int64_t hidden = 0;        // H residual width; draft: must equal the target's H
  int64_t ffn = 0;           // F SwiGLU inner size: gate/up [F, H], down [H, F]
  int64_t vocab = 0;         // V rows of token_embd [V, H] and output [V, H]
  int64_t n_heads = 0;       // nh query heads: attn.q [nh*hd, H] ([2*nh*hd, H] with the output gate)
  int64_t n_kv_heads = 0;    // nkv: attn.k / attn.v [nkv*hd, H]; nh % nkv == 0
  int64_t head_dim = 0;      // hd of q, k and v; attn.o [H, nh*hd]; q_norm/k_norm [hd]
  int64_t max_context = 0;   // trained context length (positions)

  // ---- norms and positions
  double rms_eps = 1e-6;     // every RMSNorm (trunk, q/k norms, GDN output norm)
  double rope_theta = 10000.0;
  int64_t rope_dims = 0;     // r rotated dims per head, even, <= hd (qwen35: hd/4 = 64); NEOX rotate-half
  // qwen35 interleaved M-RoPE sections (pairs per t/h/w/-): [11, 11, 10, 0]; all zero for 1-D RoPE.
  // Text-only positions make it exactly 1-D partial RoPE over r dims.
  std::array<int64_t, 4> rope_sections = {0, 0, 0, 0};
  RopeScaling rope_scaling;
  bool tied_embeddings = false;  // no `output` tensor: the LM head is token_embd

  // ---- layers
  std::vector<LayerKind> layer_kinds;  // [L]
  std::vector<int64_t> sliding_window;  // [L] attention window in positions; 0 = full attention
  DeltaNetDims gdn;                     // zero unless some layer is kGatedDeltaNet

  // ---- attention flags
  bool attn_output_gate = false;        // qwen35: out = (o * sigmoid(gate)) Wo
  bool q_gate_packed_per_head = false;  // attn.q rows per head [q_h (hd) | gate_h (hd)], not [all q | all gate]
  bool qk_norm = true;                  // per-head RMSNorm on q and k (all supported families)

  // ---- conventions of the weights this spec was read with (a loader that converts to canonical
  //      values at load time sets these to the canonical ones: false, kTiled, false)
  bool norms_zero_centred = false;  // HF qwen35: norm weights stored as w, applied as (1 + w); +1 needed
  VHeadOrder v_head_order = VHeadOrder::kTiled;
  bool ssm_a_is_log = false;        // HF: A_log stored; canonical/GGUF: -exp(A_log)
  bool hf_vl_wrapper = false;       // HF weights under model.language_model.* (Qwen3_5ForConditionalGeneration)

  // ---- tokens (when the source names them)
  std::optional<int64_t> bos_id;
  std::vector<int64_t> eos_ids;

  // ---- DFlash draft
  std::vector<int64_t> target_layer_ids;  // [m] target layers whose outputs are captured; fc is [H, m*H]
  int64_t block_size = 0;                 // B block length (root + B-1 masks)
  std::optional<int64_t> mask_token_id;   // target-vocab id fed at masked positions
  std::optional<int64_t> n_target_layers; // the target's L, when the config says

  // ---- derived
  int64_t q_dim() const { return n_heads * head_dim; }    // nh*hd
  int64_t kv_dim() const { return n_kv_heads * head_dim; }  // nkv*hd
  bool is_recurrent(int64_t layer) const { return layer_kinds[layer] == LayerKind::kGatedDeltaNet; }
  int64_t n_recurrent_layers() const;
  int64_t n_attention_layers() const { return n_layers - n_recurrent_layers(); }

  // Every invariant the forward relies on; errors name the offending field and values.
  Status validate() const;
  // One line for logs: "qwen35: 64 layers (48 gdn + 16 attn), H 5120, ...".
  std::string summary() const;
  // What the tensor-name map needs.
  TensorNameLayout name_layout() const;

  bool operator==(const ModelSpec&) const = default;
};

Result<ModelSpec> model_spec_from_hf_config(const HfConfig& config);
Result<ModelSpec> model_spec_from_hf_config(const nlohmann::json& config);
// `path` is a config.json or a directory holding one.
Result<ModelSpec> model_spec_from_hf_path(const std::string& path);

// Reads the `<arch>.*` keys of algorithms.md D.7 (arch qwen3, qwen35, dflash); other archs are
// rejected by name. Uses the file's tensor list for tied embeddings and, if no vocab key, the vocab.
Result<ModelSpec> model_spec_from_gguf(const GgufFile& gguf);

// Writes general.architecture and the `<arch>.*` hyperparameter keys exactly as llama.cpp's loader
// reads them (qwen3, qwen35; drafts as arch "dflash"). Tokenizer keys are the converter's business.
Status write_model_spec_to_gguf(const ModelSpec& spec, GgufWriter& writer);

// GGUF arch name of a family ("qwen3", "qwen35", "dflash").
const char* gguf_arch_name(ModelFamily f);

}  // namespace dflash
