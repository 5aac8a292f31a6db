// Byte-level BPE (GPT-2 / Qwen / Llama 3): regex pre-tokenization, byte alphabet, merges by rank.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/token_model.h"
#include "tokenizer/vocab.h"

namespace dflash {

class BpeModel final : public TokenModel {
 public:
  // Checks every merge against the vocabulary (both parts and their concatenation must be tokens).
  static Result<std::unique_ptr<BpeModel>> create(const Vocab& vocab);

  Status encode(std::string_view text, std::vector<int32_t>& out) const override;
  void append_bytes(int32_t id, std::string& out) const override;
  int32_t token_to_id(std::string_view token) const override;

  // BPE of one pre-tokenized word given as raw bytes (HF's BPE::tokenize on its byte-level form).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  size_t merge_count() const { return merges_.size(); }

 private:
  BpeModel() = default;
  struct Merge {
    uint32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  PreTokenizer pre_;
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;
  std::unordered_map<std::string, int32_t> token_to_id_;  // every token but padding (kUnused)
  std::array<int32_t, 256> byte_token_{};                 // id of each byte's one-character token, or -1
  std::array<int32_t, 256> fallback_token_{};             // id of <0xXX> when byte fallback is on, or -1
  std::unordered_map<uint64_t, Merge> merges_;            // (left id, right id) -> rank and result id
  std::vector<std::string> token_bytes_;                  // id -> decoded bytes

  // Word -> ids for short words already seen; bounded, shared by all threads.
  static constexpr size_t kCacheCapacity = size_t{1} << 16;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace dflash
