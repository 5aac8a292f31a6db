#include "tokenizer/stream_detokenizer.h"

#include "tokenizer/utf8.h"

namespace dflash {

std::string StreamDetokenizer::push(int32_t id) {
  tokenizer_->append_token_bytes(id, skip_special_, pending_);
  size_t complete = utf8::complete_prefix_length(pending_);
  std::string out;
  if (complete == 0) return out;
  utf8::append_lossy(out, std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamDetokenizer::finish() {
  std::string out = utf8::to_valid_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dflash
