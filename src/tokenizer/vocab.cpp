#include "tokenizer/vocab.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace dflash {
namespace {

// The regexes as HF tokenizer.json files spell them (llama.cpp spells the contractions out as
// '[sS]|'[tT]|...; the behaviour is the same).
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen 3.5: combining marks stay with their letters and out of punctuation runs.
constexpr std::string_view kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama 3: digits in groups of up to three.
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr PreTokenizerSpec kPreTokenizers[] = {
    {"qwen2", kQwen2Regex, true, false},
    {"qwen35", kQwen35Regex, true, false},
    {"llama-bpe", kLlama3Regex, false, true},
    {"gpt2", kGpt2Regex, false, false},  // llama.cpp drops the final |\s+; the isolated gaps split the same
    // Other names llama.cpp gives the same regexes (found by name only; the entries above come first).
    {"stablelm2", kQwen2Regex, false, false},
    {"llama3", kLlama3Regex, false, true},
    {"llama-v3", kLlama3Regex, false, true},
};

}  // namespace

const char* token_type_name(TokenType t) {
  switch (t) {
    case TokenType::kUndefined: return "undefined";
    case TokenType::kNormal: return "normal";
    case TokenType::kUnknown: return "unknown";
    case TokenType::kControl: return "control";
    case TokenType::kUserDefined: return "user-defined";
    case TokenType::kUnused: return "unused";
    case TokenType::kByte: return "byte";
  }
  return "invalid";
}

bool is_valid_token_type(int64_t v) { return v >= 0 && v <= 6; }

const PreTokenizerSpec* find_pre_tokenizer(std::string_view gguf_name) {
  for (const auto& p : kPreTokenizers) {
    if (p.gguf_name == gguf_name) return &p;
  }
  return nullptr;
}

const PreTokenizerSpec* find_pre_tokenizer_by_regex(std::string_view regex) {
  for (const auto& p : kPreTokenizers) {
    if (p.regex == regex) return &p;
  }
  return nullptr;
}

std::string_view gpt2_split_regex() { return kGpt2Regex; }

Status Vocab::validate() const {
  DF_RETURN_IF_ERROR(validate_tokens());
  std::unordered_set<std::string_view> seen;
  seen.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != TokenType::kUnused) seen.insert(tokens[i]);
  }
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    joined = a;
    joined += b;
    for (const std::string* part : {&a, &b, static_cast<const std::string*>(&joined)}) {
      if (!seen.count(*part))
        return corrupt("tokenizer: merge {} '{} {}' uses '{}', which is not in the vocabulary", r, a, b, *part);
    }
  }
  for (const std::string& regex : split_regexes) {
    auto compiled = RegexSplitter::compile(regex);
    if (!compiled.ok()) return Status(ErrorCode::kCorrupt, "tokenizer: " + compiled.status().message());
  }
  return Status();
}

Status Vocab::validate_tokens() const {
  if (kind != TokenizerKind::kByteLevelBpe)
    return unsupported("tokenizer: only byte-level BPE vocabularies are implemented");
  if (tokens.empty()) return corrupt("tokenizer: the vocabulary is empty");
  if (static_cast<int64_t>(tokens.size()) > kMaxVocabTokens)
    return corrupt("tokenizer: {} tokens is more than the supported {}", tokens.size(), kMaxVocabTokens);
  if (types.size() != tokens.size())
    return corrupt("tokenizer: {} token types for {} tokens", types.size(), tokens.size());
  if (static_cast<int64_t>(merges.size()) > kMaxMerges)
    return corrupt("tokenizer: {} merges is more than the supported {}", merges.size(), kMaxMerges);

  std::unordered_map<std::string_view, int32_t> seen;
  seen.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!is_valid_token_type(static_cast<int64_t>(types[i])))
      return corrupt("tokenizer: token {} has invalid type {}", i, static_cast<int32_t>(types[i]));
    if (!utf8::is_valid(tokens[i])) {
      Status s = utf8::check_valid(tokens[i], fmt::format("tokenizer: token {}", i));
      return Status(ErrorCode::kCorrupt, s.message());
    }
    if (types[i] == TokenType::kUnused) continue;
    if (tokens[i].empty()) return corrupt("tokenizer: token {} ({}) is empty", i, token_type_name(types[i]));
    auto [it, inserted] = seen.emplace(tokens[i], static_cast<int32_t>(i));
    if (!inserted)
      return corrupt("tokenizer: token '{}' appears twice, as id {} and id {}", tokens[i], it->second, i);
  }

  std::unordered_set<int32_t> added_ids;
  for (const AddedToken& t : added_tokens) {
    if (!is_valid_id(t.id))
      return corrupt("tokenizer: added token '{}' has id {} outside the vocabulary [0, {})", t.content, t.id,
                     tokens.size());
    if (!added_ids.insert(t.id).second) return corrupt("tokenizer: two added tokens have id {}", t.id);
    if (t.content.empty()) return corrupt("tokenizer: added token {} has empty content", t.id);
    if (tokens[t.id] != t.content)
      return corrupt("tokenizer: added token {} is '{}' but the vocabulary has '{}' at that id", t.id, t.content,
                     tokens[t.id]);
    TokenType want = t.special ? TokenType::kControl : TokenType::kUserDefined;
    if (types[t.id] != want)
      return corrupt("tokenizer: added token {} '{}' has type {}, expected {}", t.id, t.content,
                     token_type_name(types[t.id]), token_type_name(want));
  }

  struct Named {
    const char* name;
    const std::optional<int32_t>& id;
  };
  for (const Named& n : {Named{"bos", bos_id}, Named{"eos", eos_id}, Named{"eot", eot_id}, Named{"pad", pad_id},
                         Named{"unk", unk_id}}) {
    if (n.id && !is_valid_id(*n.id))
      return corrupt("tokenizer: {} token id {} is outside the vocabulary [0, {})", n.name, *n.id, tokens.size());
  }
  return Status();
}

std::optional<int32_t> Vocab::find_token(std::string_view token) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == token && types[i] != TokenType::kUnused) return static_cast<int32_t>(i);
  }
  return std::nullopt;
}

std::vector<int32_t> Vocab::end_of_generation_ids() const {
  // The same names llama.cpp treats as end of generation when a vocabulary has them.
  static constexpr std::string_view kNames[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>",
                                                "<|end_of_text|>", "<|end|>", "<end_of_turn>", "<|fim_pad|>",
                                                "<|repo_name|>", "<|file_sep|>"};
  std::vector<int32_t> ids;
  if (eos_id) ids.push_back(*eos_id);
  if (eot_id) ids.push_back(*eot_id);
  for (const AddedToken& t : added_tokens) {
    for (std::string_view name : kNames) {
      if (t.content == name) ids.push_back(t.id);
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace dflash
