// Random-weight models of real shapes, written straight to GGUF: speed does not depend on weight values,
// so `dflash bench` measures Qwen3-8B- or Qwen3.5-27B-shaped files no machine here has the weights of.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "formats/gguf.h"
#include "formats/gguf_quantize.h"
#include "model/model_spec.h"

namespace dflash {

// The names `--make-random` accepts ("qwen3-0.6b", "qwen3-8b", "qwen3.5-9b", "qwen3.5-27b", ...).
std::vector<std::string_view> random_model_presets();
// The preset's HF config.json (the published model's dimensions).
Result<ModelSpec> random_model_spec(std::string_view preset);

// Adds the spec's metadata and every tensor, with llama.cpp's type mix for `file_type` and deterministic
// random values (norms near 1, ssm_a < 0, matrices ~ N(0, 1/in)), generated and quantized at write time.
// distinct_rows > 0: a tensor of more rows than that repeats its first distinct_rows rows (row r is row
// r % distinct_rows, the same bytes the full file has there), so only those are generated and quantized: a
// 27B-shaped file is then written in seconds instead of minutes (speed does not depend on the values; the
// repeated rows make many logits equal, so acceptance figures from such a file mean nothing).
Status add_random_model(const ModelSpec& spec, FileType file_type, uint64_t seed, int threads, GgufWriter& writer,
                        int64_t distinct_rows = 0);

}  // namespace dflash
