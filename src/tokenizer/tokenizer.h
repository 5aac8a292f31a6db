// Tokenizer: text <-> token ids for a Vocab (added tokens, NFC, then the model), HF tokenizers' semantics.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/token_model.h"
#include "tokenizer/vocab.h"

namespace dflash {

class Tokenizer {
 public:
  // Validates the vocabulary and builds the lookup structures.
  static Result<Tokenizer> create(Vocab vocab);

  // Text -> ids, as HF tokenizers' encode(text, add_special_tokens=False):
  //  1. added tokens are cut out of the raw text (leftmost-longest; see AddedTokenMatcher). With
  //     parse_special false, special (kControl) tokens are not matched and are tokenized as plain text,
  //     while non-special added tokens (<think>) still are (HF's split_special_tokens=True);
  //  2. the rest is NFC-normalized when the vocabulary says so, and normalized added tokens are cut out;
  //  3. the model (pre-tokenizer regex, byte alphabet, BPE merges) encodes each remaining piece.
  // No BOS/EOS is added (see Vocab::add_bos). Text that is not valid UTF-8 is refused with an error
  // naming the offset: HF tokenizers cannot receive it at all (Rust &str / Python str).
  Result<std::vector<int32_t>> encode(std::string_view text, bool parse_special) const;

  // Ids -> bytes, as HF's decode() before its final lossy UTF-8 conversion: concatenates the tokens'
  // bytes. skip_special drops special tokens (kControl). Padding (kUnused) and ids outside the
  // vocabulary decode to nothing, as in HF. The result can end inside (or contain) invalid UTF-8;
  // decode_text() repairs it the way HF does.
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;
  // decode() with each invalid sequence replaced by U+FFFD: exactly HF's decode() output.
  std::string decode_text(std::span<const int32_t> ids, bool skip_special) const;
  // Appends one token's bytes (nothing for padding or an unknown id; nothing for a special token
  // when skip_special).
  void append_token_bytes(int32_t id, bool skip_special, std::string& out) const;

  const Vocab& vocab() const { return *vocab_; }
  int32_t size() const { return vocab_->size(); }
  bool is_special(int32_t id) const {
    return vocab_->is_valid_id(id) && vocab_->types[id] == TokenType::kControl;
  }
  // The id of a token by its vocabulary spelling ("Ġthe", "<|im_end|>"), or nullopt.
  std::optional<int32_t> token_to_id(std::string_view token) const;

 private:
  Tokenizer() = default;
  std::shared_ptr<const Vocab> vocab_;
  std::shared_ptr<const TokenModel> model_;
  AddedTokenMatcher raw_matcher_;         // added tokens with normalized = false
  AddedTokenMatcher normalized_matcher_;  // added tokens with normalized = true (matched after NFC)
};

}  // namespace dflash
