// Weights: a model's tensors under canonical names, from a GGUF file (used in place from the mapping) or
// an HF checkpoint (converted to canonical form once, at load: norm +1, -exp(A_log), tiled V-heads).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/model_spec.h"
#include "ops/backend.h"
#include "ops/cpu/ops.h"

namespace dflash {

class Weights {
 public:
  // `path`: a GGUF file, or an HF directory (config.json + safetensors). Matrices keep their stored type
  // (any quant type from GGUF; f32/f16/bf16 from HF); vectors (norms, biases, ssm_a) and the conv kernel
  // become f32. Every tensor the spec implies must be present with the shape it implies.
  static Result<Weights> load(const std::string& path, int threads = 0);

  // The model as loaded, in canonical conventions (norms applied as x̂·w, tiled V-heads, ssm_a = -exp(A_log)).
  const ModelSpec& spec() const { return spec_; }
  const std::string& path() const { return path_; }

  // A matrix [out, in] (or a vector as one row); nullptr when the model has no such tensor.
  const cpu::WeightView* find(std::string_view canonical) const;
  // f32 data of a vector tensor (norm weights, dt_bias, ssm_a, conv kernel); nullptr when absent.
  const float* f32(std::string_view canonical) const;
  // Total bytes of all tensors as stored for compute.
  uint64_t bytes() const { return bytes_; }

  // The same tensors copied into `be`'s memory (a device backend); the result does not refer to this one.
  // With `only` non-empty, just those tensors (names absent here are skipped): e.g. a target's embedding
  // and head for a draft on another device.
  Result<Weights> to_backend(Backend& be, std::span<const std::string_view> only = {}) const;
  // The tensors whose canonical names `keep` accepts, copied into `be`'s memory (a shard of a layer split).
  Result<Weights> to_backend_if(Backend& be, const std::function<bool(std::string_view)>& keep) const;
  // Whether a shard holding layers [begin, end) of `n_layers` needs tensor `canonical`: its layers'
  // ("layers.<i>."), the embedding on the first shard, the final norm and head on the last (the embedding
  // too when the head is tied to it), and any tensor outside the layers.
  bool shard_needs(std::string_view canonical, int64_t begin, int64_t end) const;
  // Bytes of the tensors such a shard needs.
  uint64_t shard_bytes(int64_t begin, int64_t end) const;
  // Elements of the matrices a token's pass through the layers multiplies by (every 2-D "layers." tensor but
  // the DeltaNet conv kernel): a token's product FLOPs are twice this, besides attention and the head.
  uint64_t layer_matmul_elements() const;

 private:
  Status add(const std::string& canonical, cpu::WeightView view);

  ModelSpec spec_;
  std::string path_;
  std::shared_ptr<const GgufFile> gguf_;  // keeps the mapping the views point into
  std::map<std::string, cpu::WeightView, std::less<>> tensors_;
  std::vector<std::vector<uint8_t>> owned_;  // converted tensors
  std::vector<Buffer> on_backend_;           // tensors copied to a backend (to_backend)
  uint64_t bytes_ = 0;
};

}  // namespace dflash
