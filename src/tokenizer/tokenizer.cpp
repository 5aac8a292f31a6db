#include "tokenizer/tokenizer.h"

#include "tokenizer/bpe_model.h"
#include "tokenizer/utf8.h"

namespace dflash {

Result<Tokenizer> Tokenizer::create(Vocab vocab) {
  // The model build checks the merges and compiles the regexes itself.
  DF_RETURN_IF_ERROR(vocab.validate_tokens());
  Tokenizer t;
  if (vocab.kind != TokenizerKind::kByteLevelBpe)
    return unsupported("tokenizer: only byte-level BPE is implemented");
  DF_ASSIGN_OR_RETURN(std::unique_ptr<BpeModel> bpe, BpeModel::create(vocab));
  t.model_ = std::move(bpe);

  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_content, normalized_content;
  for (const AddedToken& a : vocab.added_tokens) {
    if (a.normalized) {
      // HF matches a normalized token by its normalized form.
      std::string content = a.content;
      if (vocab.nfc) {
        DF_ASSIGN_OR_RETURN(content, utf8::nfc(a.content));
      }
      normalized.push_back(a);
      normalized_content.push_back(std::move(content));
    } else {
      raw.push_back(a);
      raw_content.push_back(a.content);
    }
  }
  t.raw_matcher_ = AddedTokenMatcher(std::move(raw), raw_content);
  t.normalized_matcher_ = AddedTokenMatcher(std::move(normalized), normalized_content);
  t.vocab_ = std::make_shared<const Vocab>(std::move(vocab));
  return t;
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool parse_special) const {
  DF_RETURN_IF_ERROR(utf8::check_valid(text, "text to tokenize"));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<TextPiece> pieces;
  raw_matcher_.split(text, parse_special, pieces);
  std::vector<TextPiece> inner;
  for (const TextPiece& p : pieces) {
    if (p.id >= 0) {
      ids.push_back(p.id);
      continue;
    }
    std::string_view piece = text.substr(p.begin, p.end - p.begin);
    std::string normalized;
    if (vocab_->nfc) {
      DF_ASSIGN_OR_RETURN(normalized, utf8::nfc(piece));
      piece = normalized;
    }
    if (normalized_matcher_.empty()) {
      DF_RETURN_IF_ERROR(model_->encode(piece, ids));
      continue;
    }
    inner.clear();
    normalized_matcher_.split(piece, parse_special, inner);
    for (const TextPiece& q : inner) {
      if (q.id >= 0) {
        ids.push_back(q.id);
      } else {
        DF_RETURN_IF_ERROR(model_->encode(piece.substr(q.begin, q.end - q.begin), ids));
      }
    }
  }
  return ids;
}

void Tokenizer::append_token_bytes(int32_t id, bool skip_special, std::string& out) const {
  if (!vocab_->is_valid_id(id)) return;
  TokenType type = vocab_->types[id];
  if (type == TokenType::kUnused) return;
  if (skip_special && type == TokenType::kControl) return;
  model_->append_bytes(id, out);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) append_token_bytes(id, skip_special, out);
  return out;
}

std::string Tokenizer::decode_text(std::span<const int32_t> ids, bool skip_special) const {
  return utf8::to_valid_lossy(decode(ids, skip_special));
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  int32_t id = model_->token_to_id(token);
  if (id < 0) return std::nullopt;
  return id;
}

}  // namespace dflash
