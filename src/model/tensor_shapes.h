// The shape every canonical tensor of a ModelSpec must have (row-major [out, in], as HF stores it;
// GGUF lists the same dims innermost first). Loaders and the converter check weights against it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/model_spec.h"

namespace dflash {

// E.g. "layers.3.attn.q" of a qwen35 spec -> [2*nh*hd, H]; "layers.0.gdn.conv" -> [conv_dim, K].
Result<std::vector<int64_t>> canonical_tensor_shape(const ModelSpec& spec, std::string_view canonical);

}  // namespace dflash
