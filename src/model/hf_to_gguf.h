// HF safetensors weights -> GGUF tensors: renaming through the one TensorNameMap and the documented
// transforms (algorithms.md D.8: norm +1, ssm_a = -exp(A_log), conv squeeze, V-head reorder).
#pragma once

#include <functional>
#include <optional>
#include <vector>
#include <string>

#include "base/status.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/model_spec.h"

namespace dflash {

struct HfToGgufOptions {
  // Type of the 2-D weight matrices; nullopt keeps the checkpoint's precision (f32, f16 or bf16).
  // 1-D tensors (norms, biases, ssm_a) and the conv kernel are always f32, as llama.cpp requires;
  // a matrix whose rows are not a whole number of blocks of the chosen type is stored as f16.
  std::optional<DType> weight_type;
  int threads = 0;  // <= 0: one per hardware thread
};

// The spec a checkpoint converts to: `spec` (read from its config.json) adjusted to what the weights
// hold (MTP layers dropped when the checkpoint carries none) and to GGUF conventions (tiled V-heads,
// norms with +1 folded in, ssm_a stored as -exp(A_log)).
Result<ModelSpec> gguf_spec_for_checkpoint(const ModelSpec& spec, const SafetensorsModel& weights);

// One checkpoint tensor on its way to its GGUF (= canonical) form.
struct HfTensorPlan {
  std::string canonical;               // "layers.3.attn.q"
  std::string gguf_name;               // "blk.3.attn_q.weight"
  const SafetensorsTensor* src = nullptr;
  DType src_type = DType::kF32;
  DType dst_type = DType::kF32;
  int64_t rows = 1, cols = 1;          // source viewed as [rows, cols] row-major (1-D: one row)
  std::vector<uint64_t> gguf_shape;    // innermost first
  std::vector<int64_t> row_perm;       // out row r <- source row row_perm[r] (empty: identity)
  std::vector<int64_t> col_perm;       // out col c <- source col col_perm[c] (empty: identity)
  bool plus_one = false;               // zero-centred norm: + 1
  bool neg_exp = false;                // A_log -> -exp(A_log)
};

// Checks the checkpoint against the spec (every tensor present, none unknown, shapes as the config
// implies) and plans each tensor's conversion.
Result<std::vector<HfTensorPlan>> plan_hf_tensors(const ModelSpec& hf_spec, const SafetensorsModel& weights,
                                                  const HfToGgufOptions& options);

// Produces a planned tensor's converted bytes (rows of dst_type, in order) through `sink`, in batches.
using ByteSink = std::function<Status(const void* data, size_t bytes)>;
Status produce_hf_tensor(const HfTensorPlan& plan, int threads, const ByteSink& sink);

// Adds every tensor of the model to `writer` under its GGUF name. Tensor data is produced at
// writer.write() time from the mapped checkpoint, so `weights` must outlive that call. Errors name
// missing or unexpected tensors, shape mismatches and unsupported element types.
Status add_hf_weights_to_gguf(const ModelSpec& hf_spec, const SafetensorsModel& weights,
                              const HfToGgufOptions& options, GgufWriter& writer);

// llama.cpp's `general.file_type` (llama_ftype) for a weight type: 0 f32, 1 f16, 7 q8_0, 32 bf16, ...
std::optional<int> llama_file_type(DType weight_type);

}  // namespace dflash
