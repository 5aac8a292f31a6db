// Loads a Vocab from Hugging Face tokenizer.json (+ tokenizer_config.json), treating both as hostile.
#pragma once

#include <string>
#include <string_view>

#include "tokenizer/vocab.h"

namespace dflash {

inline constexpr size_t kMaxTokenizerJsonBytes = size_t{512} << 20;

// Supported: model BPE (merges as "a b" strings or [a, b] pairs; byte_fallback, ignore_merges,
// unk_token), normalizer null / NFC / Sequence of NFC, pre_tokenizer ByteLevel or Sequence of Split
// (Regex or String pattern, behavior Isolated) followed by ByteLevel, decoder ByteLevel or null, and
// added_tokens with their flags. Anything else is refused with kUnsupported naming what it is.
//
// `config_json` (tokenizer_config.json, may be empty) gives bos/eos/pad/unk tokens, add_bos_token,
// add_eos_token, and added tokens from added_tokens_decoder that tokenizer.json lacks.
// tokenizer.json wins for the flags of tokens it defines (it is what HF tokenizers itself reads).
// Ids no token claims become padding (kUnused).
Result<Vocab> vocab_from_tokenizer_json(std::string_view tokenizer_json, std::string_view config_json = {});

// Reads <dir>/tokenizer.json and, when present, <dir>/tokenizer_config.json.
Result<Vocab> load_tokenizer_json_dir(const std::string& dir);

}  // namespace dflash
