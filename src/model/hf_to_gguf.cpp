#include "model/hf_to_gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/ranges.h>

#include "base/file_io.h"
#include "base/log.h"
#include "model/tensor_shapes.h"
#include "tensor/quant.h"

namespace dflash {
namespace {

// Index map of the V-head reorder over `n_heads * head_size` positions: out[t] = in[perm[t]].
// HF groups V-heads by K-head (K0v0..K0v{r-1}, K1v0, ...); GGUF tiles them (K0v0, K1v0, ..., K0v1, ...),
// so tiled position (v, k) takes grouped position (k, v).
std::vector<int64_t> v_head_permutation(int64_t n_k_heads, int64_t n_v_heads, int64_t head_size) {
  const int64_t r = n_v_heads / n_k_heads;
  std::vector<int64_t> perm(static_cast<size_t>(n_v_heads * head_size));
  for (int64_t v = 0; v < r; ++v)
    for (int64_t k = 0; k < n_k_heads; ++k)
      for (int64_t i = 0; i < head_size; ++i)
        perm[((v * n_k_heads + k) * head_size) + i] = (k * r + v) * head_size + i;
  return perm;
}

}  // namespace

Status produce_hf_tensor(const HfTensorPlan& p, int threads, const ByteSink& sink) {
  auto src_row_bytes = row_bytes(p.src_type, p.cols);
  auto dst_row_bytes = row_bytes(p.dst_type, p.cols);
  if (!src_row_bytes.ok() || !dst_row_bytes.ok()) return internal_error("bad row size for '{}'", p.gguf_name);
  // Batches of rows through f32: bounded memory whatever the tensor size.
  const int64_t batch = std::max<int64_t>(1, (int64_t{8} << 20) / std::max<int64_t>(1, p.cols * 4));
  std::vector<float> f32(static_cast<size_t>(std::min(batch, p.rows) * p.cols));
  std::vector<float> row_tmp(static_cast<size_t>(p.cols));
  std::vector<uint8_t> src_copy(*src_row_bytes);
  std::vector<uint8_t> out(static_cast<size_t>(std::min(batch, p.rows)) * *dst_row_bytes);
  for (int64_t r0 = 0; r0 < p.rows; r0 += batch) {
    const int64_t n = std::min(batch, p.rows - r0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t sr = p.row_perm.empty() ? r0 + i : p.row_perm[static_cast<size_t>(r0 + i)];
      std::memcpy(src_copy.data(), p.src->data.data() + sr * *src_row_bytes, *src_row_bytes);  // data is unaligned
      float* dst = f32.data() + i * p.cols;
      float* decoded = p.col_perm.empty() ? dst : row_tmp.data();
      DF_RETURN_IF_ERROR(dequantize_row(p.src_type, src_copy.data(), decoded, p.cols));
      if (!p.col_perm.empty())
        for (int64_t c = 0; c < p.cols; ++c) dst[c] = decoded[p.col_perm[static_cast<size_t>(c)]];
      if (p.neg_exp)
        for (int64_t c = 0; c < p.cols; ++c) dst[c] = -std::exp(dst[c]);
      if (p.plus_one)
        for (int64_t c = 0; c < p.cols; ++c) dst[c] = dst[c] + 1.0f;
    }
    DF_RETURN_IF_ERROR(convert_rows(DType::kF32, f32.data(), p.dst_type, out.data(), n, p.cols, threads));
    DF_RETURN_IF_ERROR(sink(out.data(), static_cast<size_t>(n) * *dst_row_bytes));
  }
  return Status();
}

std::optional<int> llama_file_type(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ8_0: return 7;
    case DType::kQ5_0: return 8;
    case DType::kQ5_1: return 9;
    case DType::kBF16: return 32;
    default: return std::nullopt;
  }
}

Result<ModelSpec> gguf_spec_for_checkpoint(const ModelSpec& spec, const SafetensorsModel& weights) {
  ModelSpec out = spec;
  if (out.n_mtp_layers > 0) {
    bool has_mtp = false;
    for (const auto& name : weights.tensor_names())
      if (name.rfind("mtp.", 0) == 0 || name.rfind("model.mtp.", 0) == 0) has_mtp = true;
    if (!has_mtp) {
      log::info("convert: config declares {} MTP layer(s) but the checkpoint has no mtp.* tensors; writing none",
                out.n_mtp_layers);
      out.n_mtp_layers = 0;
    }
  }
  out.norms_zero_centred = false;
  out.v_head_order = VHeadOrder::kTiled;
  out.ssm_a_is_log = false;
  out.hf_vl_wrapper = false;
  return out;
}

Result<std::vector<HfTensorPlan>> plan_hf_tensors(const ModelSpec& hf_spec_in, const SafetensorsModel& weights,
                                                  const HfToGgufOptions& options) {
  DF_ASSIGN_OR_RETURN(ModelSpec gguf_spec, gguf_spec_for_checkpoint(hf_spec_in, weights));
  ModelSpec hf_spec = hf_spec_in;
  hf_spec.n_mtp_layers = gguf_spec.n_mtp_layers;
  TensorNameMap names(hf_spec.name_layout());

  const DeltaNetDims& g = hf_spec.gdn;
  const bool reorder = hf_spec.v_head_order == VHeadOrder::kGrouped && g.n_k_heads > 0 && g.n_v_heads != g.n_k_heads;
  if (reorder && g.n_v_heads % g.n_k_heads != 0)
    return invalid_argument("{} value heads are not a multiple of {} key heads", g.n_v_heads, g.n_k_heads);

  // Every source tensor must be one we know (or one we knowingly drop).
  std::vector<std::string> unexpected;
  for (const auto& name : weights.tensor_names()) {
    if (hf_tensor_is_vision(name)) continue;
    const TensorNameEntry* e = names.by_hf(name);
    if (e == nullptr) unexpected.push_back(name);
  }
  if (!unexpected.empty())
    return invalid_argument("checkpoint has {} tensor(s) a {} model does not have, e.g. '{}'", unexpected.size(),
                            model_family_name(hf_spec.family), unexpected.front());

  std::vector<HfTensorPlan> plans;
  for (const TensorNameEntry& e : names.entries()) {
    if (e.hf.empty() || e.gguf.empty()) continue;
    const SafetensorsTensor* t = weights.find(e.hf);
    if (t == nullptr && hf_spec.hf_vl_wrapper) {
      // The map spells trunk names in the layout's form; accept the other spelling too.
      for (const auto& name : weights.tensor_names())
        if (names.by_hf(name) == &e) t = weights.find(name);
    }
    if (t == nullptr) {
      if (e.canonical == "output" && hf_spec.tied_embeddings) continue;
      return not_found("checkpoint has no tensor '{}' (GGUF '{}')", e.hf, e.gguf);
    }
    HfTensorPlan p;
    p.canonical = e.canonical;
    p.gguf_name = e.gguf;
    p.src = t;
    auto st = safetensors_to_dtype(t->dtype);
    if (!st.ok()) return st.status().with_context(fmt::format("tensor '{}'", t->name));
    p.src_type = *st;
    if (p.src_type != DType::kF32 && p.src_type != DType::kF16 && p.src_type != DType::kBF16)
      return unsupported("tensor '{}' has element type {}; convert reads f32, f16 and bf16", t->name,
                         safetensors_dtype_name(t->dtype));
    std::vector<uint64_t> shape = t->shape;
    if (e.hf_to_gguf & kHfSqueeze) std::erase(shape, uint64_t{1});
    if (shape.empty()) shape.push_back(1);
    DF_ASSIGN_OR_RETURN(std::vector<int64_t> expected, canonical_tensor_shape(hf_spec, e.canonical));
    if (std::vector<int64_t>(shape.begin(), shape.end()) != expected)
      return corrupt("tensor '{}' has shape {} but the config implies {}", t->name, fmt::join(t->shape, "x"),
                     fmt::join(expected, "x"));
    p.rows = shape.size() == 2 ? static_cast<int64_t>(shape[0]) : 1;
    p.cols = static_cast<int64_t>(shape.back());
    p.gguf_shape.assign(shape.rbegin(), shape.rend());

    const bool one_d = shape.size() == 1;
    const bool conv = e.canonical.find("gdn.conv") != std::string::npos;
    if (one_d || conv) {
      p.dst_type = DType::kF32;
    } else if (options.weight_type) {
      p.dst_type = *options.weight_type;
      auto info = dtype_info(p.dst_type);
      if (!info || p.cols % info->block_elems != 0) p.dst_type = DType::kF16;
    } else {
      p.dst_type = p.src_type;
    }

    p.plus_one = (e.hf_to_gguf & kHfNormPlusOne) && hf_spec.norms_zero_centred;
    p.neg_exp = (e.hf_to_gguf & kHfNegExp) && hf_spec.ssm_a_is_log;
    if (reorder) {
      // 1-D tensors (A_log, dt_bias) hold one value per V-head: their "rows" are the elements.
      const bool vrows = e.hf_to_gguf & kHfVHeadRows;
      const bool vrows_after_qk = e.hf_to_gguf & kHfVHeadRowsAfterQK;
      if (vrows && one_d) {
        if (p.cols % g.n_v_heads != 0) return corrupt("tensor '{}' length {} is not per V-head", t->name, p.cols);
        p.col_perm = v_head_permutation(g.n_k_heads, g.n_v_heads, p.cols / g.n_v_heads);
      } else if (vrows) {
        if (p.rows % g.n_v_heads != 0)
          return corrupt("tensor '{}' has {} rows, not a multiple of {} V-heads", t->name, p.rows, g.n_v_heads);
        p.row_perm = v_head_permutation(g.n_k_heads, g.n_v_heads, p.rows / g.n_v_heads);
      } else if (vrows_after_qk) {
        const int64_t qk = 2 * g.key_dim();
        if (p.rows != qk + g.value_dim())
          return corrupt("tensor '{}' has {} rows; expected {} (q, k, v)", t->name, p.rows, qk + g.value_dim());
        auto v = v_head_permutation(g.n_k_heads, g.n_v_heads, g.d_v);
        p.row_perm.resize(static_cast<size_t>(p.rows));
        std::iota(p.row_perm.begin(), p.row_perm.begin() + qk, 0);
        for (size_t i = 0; i < v.size(); ++i) p.row_perm[static_cast<size_t>(qk) + i] = qk + v[i];
      }
      if (e.hf_to_gguf & kHfVHeadCols) {
        if (p.cols != g.value_dim())
          return corrupt("tensor '{}' has {} columns; expected {} (V-heads x dv)", t->name, p.cols, g.value_dim());
        p.col_perm = v_head_permutation(g.n_k_heads, g.n_v_heads, g.d_v);
      }
    }
    plans.push_back(std::move(p));
  }

  return plans;
}

Status add_hf_weights_to_gguf(const ModelSpec& hf_spec, const SafetensorsModel& weights,
                              const HfToGgufOptions& options, GgufWriter& writer) {
  DF_ASSIGN_OR_RETURN(std::vector<HfTensorPlan> plans, plan_hf_tensors(hf_spec, weights, options));
  const int threads = options.threads;
  for (auto& p : plans) {
    auto plan = std::make_shared<HfTensorPlan>(std::move(p));
    DF_RETURN_IF_ERROR(writer.add_tensor(plan->gguf_name, plan->dst_type, plan->gguf_shape, [plan, threads](std::FILE* f) {
      return produce_hf_tensor(*plan, threads, [f](const void* data, size_t n) { return write_all(f, data, n); });
    }));
  }
  return Status();
}

}  // namespace dflash
