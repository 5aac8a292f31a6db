// Random-weight HF checkpoints (config.json + model.safetensors) of any ModelSpec the converter reads,
// with every tensor the name map expects, in HF's spelling and HF's conventions (A_log, zero-centred norms).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "formats/safetensors.h"

namespace dflash::test {

// Writes `config` as dir/config.json and random weights of the shapes it implies as dir/model.safetensors.
Status write_random_hf_model(const std::string& dir, const nlohmann::json& config, uint64_t seed,
                             SafetensorsDType dtype = SafetensorsDType::kBF16);

// A small qwen3 config (hidden 64, 2 layers, GQA) with the given vocabulary size.
nlohmann::json tiny_qwen3_config(int64_t vocab, bool tied);
// A small qwen3_5 text config (8 layers: 6 Gated DeltaNet + 2 gated attention, H_v = 2 H_k).
nlohmann::json tiny_qwen35_config(int64_t vocab);

}  // namespace dflash::test
