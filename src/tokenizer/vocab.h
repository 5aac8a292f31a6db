// A tokenizer's vocabulary as loaded from tokenizer.json or GGUF: tokens, types, merges, added tokens, ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dflash {

// Which algorithm turns text into ids. Only byte-level BPE (GPT-2, Qwen, Llama 3) is implemented;
// SentencePiece-style vocabularies (GGUF "llama") are recognized and refused with kUnsupported.
enum class TokenizerKind { kByteLevelBpe, kSentencePiece };

// Token types with llama.cpp's numbering (GGUF tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special added tokens (<|im_start|>): matched in text only when parsing specials
  kUserDefined = 4,  // other added tokens (<think>): always matched in text
  kUnused = 5,       // padding up to the model's vocabulary size ([PAD151669]); never produced, decodes to ""
  kByte = 6,         // byte-fallback tokens <0x00>..<0xFF>
};
const char* token_type_name(TokenType t);
bool is_valid_token_type(int64_t v);

// A token matched in the text before the model sees it, with HF tokenizers' flags.
struct AddedToken {
  int32_t id = -1;
  std::string content;       // the text it matches, as is (not in the byte-level alphabet)
  bool special = false;      // skipped by decode(skip_special); not matched when parse_special is off
  bool lstrip = false;       // absorbs whitespace on its left
  bool rstrip = false;       // absorbs whitespace on its right
  bool normalized = false;   // matched against the normalized (NFC) text instead of the raw text
  bool single_word = false;  // matched only when not inside a word
};

// A pre-tokenizer family known by name: the name GGUF files carry (tokenizer.ggml.pre) and the split
// regex that HF's tokenizer.json carries for it.
struct PreTokenizerSpec {
  std::string_view gguf_name;
  std::string_view regex;
  bool nfc;            // the family's HF tokenizer normalizes to NFC (GGUF has no key for it)
  bool ignore_merges;  // the family's HF BPE takes a word whole when the vocabulary has it
};
const PreTokenizerSpec* find_pre_tokenizer(std::string_view gguf_name);
const PreTokenizerSpec* find_pre_tokenizer_by_regex(std::string_view regex);
// GPT-2's own regex (what HF's ByteLevel pre-tokenizer applies when use_regex is true).
std::string_view gpt2_split_regex();

inline constexpr int64_t kMaxVocabTokens = int64_t{1} << 24;  // loaders refuse larger vocabularies
inline constexpr int64_t kMaxMerges = int64_t{1} << 24;

struct Vocab {
  TokenizerKind kind = TokenizerKind::kByteLevelBpe;
  // id -> token. Model tokens are spelled in GPT-2's byte-level alphabet ("Ġthe"); added tokens are
  // their content as is ("<|im_start|>"); holes and padding are "" or "[PADn]" with type kUnused.
  std::vector<std::string> tokens;
  std::vector<TokenType> types;  // id -> type, same length as tokens
  std::vector<std::pair<std::string, std::string>> merges;  // by rank: merges[0] applies first
  std::vector<AddedToken> added_tokens;                     // in id order

  std::string pre_name;                    // tokenizer.ggml.pre ("qwen2"), "" when not a known family
  std::vector<std::string> split_regexes;  // applied in order; each isolates its matches
  bool nfc = false;                        // normalize text to NFC before the model
  bool ignore_merges = false;
  bool byte_fallback = false;  // unknown characters become <0xXX> tokens

  std::optional<int32_t> bos_id, eos_id, eot_id, pad_id, unk_id;
  bool add_bos = false;
  bool add_eos = false;

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  bool is_valid_id(int64_t id) const { return id >= 0 && id < static_cast<int64_t>(tokens.size()); }
  // Checks every invariant: validate_tokens() plus every merge's parts and result being tokens and
  // every split regex compiling. A loader's last step.
  Status validate() const;
  // Sizes, types, UTF-8, uniqueness, added tokens and special ids (what a model build does not recheck).
  Status validate_tokens() const;
  // Linear search; for loaders and tests, not for hot paths.
  std::optional<int32_t> find_token(std::string_view token) const;
  // Ids that end generation: eos, eot and the control tokens families use for it (<|im_end|>, ...).
  std::vector<int32_t> end_of_generation_ids() const;
};

}  // namespace dflash
