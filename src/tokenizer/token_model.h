// The model step of a tokenizer (BPE now, SentencePiece later): plain text to ids, and ids to bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dflash {

class TokenModel {
 public:
  virtual ~TokenModel() = default;
  // Encodes normalized text that holds no added tokens, appending ids to `out`.
  virtual Status encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // Appends the bytes token `id` (a valid id) decodes to.
  virtual void append_bytes(int32_t id, std::string& out) const = 0;
  // The id of a token by its vocabulary spelling, or -1 (padding tokens are not found).
  virtual int32_t token_to_id(std::string_view token) const = 0;
};

}  // namespace dflash
