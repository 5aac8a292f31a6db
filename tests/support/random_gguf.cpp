#include "support/random_gguf.h"

#include <cmath>
#include <vector>

#include "base/file_io.h"
#include "base/splitmix.h"
#include "formats/gguf.h"
#include "tensor/quant.h"

namespace dflash::test {
namespace {

using Shape = std::vector<uint64_t>;

bool is_qwen35(const RandomModelSpec& s) { return s.arch == "qwen35"; }

bool is_full_attention(const RandomModelSpec& s, uint32_t layer) {
  return !is_qwen35(s) || (layer + 1) % s.full_attention_interval == 0;
}


// Values for one tensor: norms near 1, ssm_a negative (it holds -exp(A_log)), weights ~N(0, scale) with
// an occasional outlier so the quantizers' scale choices are exercised.
void fill(const RandomModelSpec& spec, const std::string& name, std::vector<float>& v) {
  SplitMix64 rng{seed_for_name(name, spec.seed)};
  const bool norm = name.find("norm") != std::string::npos;
  const bool ssm_a = name.ends_with("ssm_a");
  for (float& x : v) {
    if (norm) x = 1.0f + 0.1f * rng.normal();
    else if (ssm_a) x = -std::exp(rng.normal());
    else x = spec.scale * rng.normal() * (rng.uniform() < 0.002f ? 12.0f : 1.0f);
  }
}

}  // namespace

std::vector<std::pair<std::string, std::vector<uint64_t>>> random_model_tensors(const RandomModelSpec& s) {
  std::vector<std::pair<std::string, Shape>> t;
  const uint64_t e = s.n_embd, hd = s.head_dim;
  t.push_back({"token_embd.weight", {e, s.n_vocab}});
  for (uint32_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    t.push_back({p + "attn_norm.weight", {e}});
    if (is_full_attention(s, il)) {
      // qwen35 packs the output gate with Q: twice the rows.
      t.push_back({p + "attn_q.weight", {e, hd * s.n_head * (is_qwen35(s) ? 2 : 1)}});
      t.push_back({p + "attn_k.weight", {e, hd * s.n_head_kv}});
      t.push_back({p + "attn_v.weight", {e, hd * s.n_head_kv}});
      t.push_back({p + "attn_output.weight", {hd * s.n_head, e}});
      t.push_back({p + "attn_q_norm.weight", {hd}});
      t.push_back({p + "attn_k_norm.weight", {hd}});
    } else {
      const uint64_t key_dim = uint64_t{s.ssm_state_size} * s.ssm_group_count;
      const uint64_t value_dim = uint64_t{s.ssm_state_size} * s.ssm_time_step_rank;
      t.push_back({p + "attn_qkv.weight", {e, 2 * key_dim + value_dim}});
      t.push_back({p + "attn_gate.weight", {e, value_dim}});
      t.push_back({p + "ssm_conv1d.weight", {s.ssm_conv_kernel, 2 * key_dim + value_dim}});
      t.push_back({p + "ssm_dt.bias", {s.ssm_time_step_rank}});
      t.push_back({p + "ssm_a", {s.ssm_time_step_rank}});
      t.push_back({p + "ssm_beta.weight", {e, s.ssm_time_step_rank}});
      t.push_back({p + "ssm_alpha.weight", {e, s.ssm_time_step_rank}});
      t.push_back({p + "ssm_norm.weight", {s.ssm_state_size}});
      t.push_back({p + "ssm_out.weight", {value_dim, e}});
    }
    t.push_back({p + (is_qwen35(s) ? "post_attention_norm.weight" : "ffn_norm.weight"), {e}});
    t.push_back({p + "ffn_gate.weight", {e, s.n_ff}});
    t.push_back({p + "ffn_up.weight", {e, s.n_ff}});
    t.push_back({p + "ffn_down.weight", {s.n_ff, e}});
  }
  t.push_back({"output_norm.weight", {e}});
  if (!s.tied_embeddings) t.push_back({"output.weight", {e, s.n_vocab}});
  return t;
}

Status write_random_gguf(const std::string& path, const RandomModelSpec& s) {
  if (s.arch != "qwen3" && s.arch != "qwen35") return invalid_argument("random model arch '{}' is not qwen3/qwen35", s.arch);
  if (s.n_layer == 0 || s.n_head == 0 || s.n_head_kv == 0 || s.full_attention_interval == 0)
    return invalid_argument("random model needs layers, heads and a full-attention interval");
  GgufWriter w;
  const std::string a = s.arch;
  w.set("general.architecture", GgufValue::string(a));
  w.set("general.type", GgufValue::string("model"));
  w.set("general.name", GgufValue::string("random " + a));
  w.set(a + ".block_count", GgufValue::u32(s.n_layer));
  w.set(a + ".context_length", GgufValue::u32(s.context_length));
  w.set(a + ".embedding_length", GgufValue::u32(s.n_embd));
  w.set(a + ".feed_forward_length", GgufValue::u32(s.n_ff));
  w.set(a + ".attention.head_count", GgufValue::u32(s.n_head));
  w.set(a + ".attention.head_count_kv", GgufValue::u32(s.n_head_kv));
  w.set(a + ".rope.freq_base", GgufValue::f32(a == "qwen35" ? 10000000.0f : 1000000.0f));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::f32(1e-6f));
  w.set(a + ".attention.key_length", GgufValue::u32(s.head_dim));
  w.set(a + ".attention.value_length", GgufValue::u32(s.head_dim));
  if (is_qwen35(s)) {
    w.set(a + ".rope.dimension_count", GgufValue::u32(s.rope_dims));
    const int64_t q = s.rope_dims / 2;  // rotary pairs, split over (t, h, w) as mrope does
    w.set(a + ".rope.dimension_sections", GgufValue::int_array(GgufType::kI32, {q - 2 * (q / 3), q / 3, q / 3, 0}));
    w.set(a + ".ssm.conv_kernel", GgufValue::u32(s.ssm_conv_kernel));
    w.set(a + ".ssm.state_size", GgufValue::u32(s.ssm_state_size));
    w.set(a + ".ssm.group_count", GgufValue::u32(s.ssm_group_count));
    w.set(a + ".ssm.time_step_rank", GgufValue::u32(s.ssm_time_step_rank));
    w.set(a + ".ssm.inner_size", GgufValue::u32(s.ssm_state_size * s.ssm_time_step_rank));
    w.set(a + ".full_attention_interval", GgufValue::u32(s.full_attention_interval));
  }
  // llama_ftype of the weights: ALL_F32, MOSTLY_F16 or MOSTLY_BF16 (others left unset).
  if (s.weight_type == DType::kF32) w.set("general.file_type", GgufValue::u32(0));
  if (s.weight_type == DType::kF16) w.set("general.file_type", GgufValue::u32(1));
  if (s.weight_type == DType::kBF16) w.set("general.file_type", GgufValue::u32(32));
  w.set("general.quantization_version", GgufValue::u32(2));

  for (const auto& [name, shape] : random_model_tensors(s)) {
    // Matrices whose rows are not whole blocks of a quantized weight_type (ssm_conv1d's rows of 4) are
    // stored as vectors are, as converters do.
    const bool whole_blocks = shape[0] % dtype_info(s.weight_type)->block_elems == 0;
    const DType type = shape.size() == 1 || !whole_blocks ? s.vector_type : s.weight_type;
    RandomModelSpec spec = s;
    auto data = [spec, name = name, shape = shape, type](std::FILE* f) -> Status {
      const uint64_t cols = shape[0];
      uint64_t rows = 1;
      for (size_t i = 1; i < shape.size(); ++i) rows *= shape[i];
      std::vector<float> values(cols * rows);
      fill(spec, name, values);
      DF_ASSIGN_OR_RETURN(const uint64_t row, row_bytes(type, cols));
      std::vector<uint8_t> bytes(row * rows);
      for (uint64_t r = 0; r < rows; ++r)
        DF_RETURN_IF_ERROR(quantize_row(type, values.data() + r * cols, bytes.data() + r * row,
                                        static_cast<int64_t>(cols)));
      return write_all(f, bytes.data(), bytes.size());
    };
    DF_RETURN_IF_ERROR(w.add_tensor(name, type, shape, data));
  }
  return w.write(path);
}

}  // namespace dflash::test
