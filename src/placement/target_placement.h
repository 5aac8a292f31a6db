// Target layer split (FEATURES.md F2; anchor-lucebox.md §8): which devices hold a target's layers and in
// what proportions. `--target-devices cuda:0,cuda:1,cpu` names the devices in layer order,
// `--target-layer-split 0.3,0.7` weighs them (default equal). Shard i ends at round(Σw_≤i / Σw · n_layers)
// and every shard gets at least one layer; the embedding lives with shard 0, the final norm and LM head
// with the last shard. A single device is the one-shard placement.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dflash {

struct ShardPlan {
  std::string device;  // "cpu" or "cuda:N"
  int64_t layer_begin = 0, layer_end = 0;
};

// The shards of `devices` (comma-separated) weighed by `weights` (comma-separated positive numbers, one per
// device; empty: equal) over n_layers layers. Errors name the flag and the entry: an empty or unknown device
// entry, the same GPU twice (`cpu` may repeat: each entry is a shard of its own), a weight that is not a
// positive finite number, a weight count that differs from the device count, weights without devices, more
// devices than layers, or weights so uneven that a shard would get no layer.
Result<std::vector<ShardPlan>> plan_target_split(std::string_view devices, std::string_view weights,
                                                 int64_t n_layers);

// The end layer of each shard for positive `weights` over n_layers (round(Σw_≤i / Σw · n)); an error when a
// shard would be empty.
Result<std::vector<int64_t>> split_layer_ends(const std::vector<double>& weights, int64_t n_layers);

// "cuda:0[0,18) cuda:1[18,36)".
std::string describe(const std::vector<ShardPlan>& shards);

// --kv-type (auto | f32 | f16): whether the attention KV of `shards` is kept in fp16. auto: fp16 when every
// shard is a GPU ("cuda:N": its attention reads half the bytes, and fp16 is what GPU servers keep), f32 when
// any is the CPU (whose fp16 reads run 0.7-0.8x) or there is no shard. Any other value is an error naming
// the flag.
Result<bool> resolve_kv_f16(std::string_view kv_type, const std::vector<ShardPlan>& shards);

}  // namespace dflash
