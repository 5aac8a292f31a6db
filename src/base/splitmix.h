// SplitMix64: a small, fast random stream that is the same on every platform (std:: distributions are
// not), for random weights and test data that must be reproducible bit for bit.
#pragma once

#include <cstdint>
#include <string_view>

namespace dflash {

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  // About N(0, 1): the sum of four uniforms, rescaled.
  float normal() { return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f; }
};

// FNV-1a of a name mixed with a seed: one independent stream per tensor name.
inline uint64_t seed_for_name(std::string_view name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace dflash
