// Streaming detokenizer: one token in, only complete UTF-8 out (partial characters are held back).
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace dflash {

// For server streaming. The concatenation of every push() and the final finish() equals
// tokenizer.decode_text(all ids, skip_special): byte sequences that can never become valid are
// replaced with U+FFFD as soon as that is certain, and an incomplete tail is replaced at finish().
// Not thread-safe; one per sequence. The tokenizer must outlive it.
class StreamDetokenizer {
 public:
  explicit StreamDetokenizer(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  // Adds one token; returns the text that is now complete (often empty mid-character).
  std::string push(int32_t id);
  // Ends the stream: returns what was held back, repaired. The detokenizer can then be reused.
  std::string finish();
  // Drops anything held back.
  void reset() { pending_.clear(); }
  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dflash
