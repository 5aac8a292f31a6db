// Random-weight GGUF models with the tensor names, shapes and hparam keys of Qwen3 (`qwen3`) and
// Qwen3.5 (`qwen35`, GatedDeltaNet + gated attention) at tiny sizes, for tests of loaders and tools.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tensor/dtype.h"

namespace dflash::test {

struct RandomModelSpec {
  std::string arch = "qwen3";  // "qwen3" or "qwen35"
  uint32_t n_layer = 4;
  uint32_t n_embd = 256;
  uint32_t n_ff = 512;
  uint32_t n_vocab = 512;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t head_dim = 64;
  uint32_t context_length = 4096;
  bool tied_embeddings = false;     // true: no output.weight (token_embd doubles as the head)
  DType weight_type = DType::kF32;  // 2-D tensors (any type tensor/quant.h writes; vector_type where rows
                                    // are not whole blocks of it)
  DType vector_type = DType::kF32;  // 1-D tensors (norms, ssm_a, ssm_dt.bias)
  // qwen35 only. Layer i is full attention when (i + 1) % full_attention_interval == 0, else GatedDeltaNet.
  uint32_t full_attention_interval = 4;
  uint32_t ssm_conv_kernel = 4;
  uint32_t ssm_state_size = 32;     // head dim of the DeltaNet k and v heads
  uint32_t ssm_group_count = 2;     // k heads
  uint32_t ssm_time_step_rank = 4;  // v heads
  uint32_t rope_dims = 16;          // partial rotary dims of the attention layers
  uint64_t seed = 1;
  float scale = 0.05f;              // weights are about N(0, scale), with a few larger outliers
};

// The model's tensors, (name, shape in ggml order), in the order llama.cpp's converter writes them.
std::vector<std::pair<std::string, std::vector<uint64_t>>> random_model_tensors(const RandomModelSpec& spec);

// Writes the model (GGUF v3): the hparams llama.cpp reads for the architecture (no tokenizer) and
// deterministic random weights (same spec and seed, same bytes), streamed tensor by tensor.
Status write_random_gguf(const std::string& path, const RandomModelSpec& spec);

}  // namespace dflash::test
