// Finds and loads a model's tokenizer: a GGUF file, an HF directory, or a tokenizer.json path.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace dflash {

// `path` is a GGUF file (its tokenizer.ggml.* metadata), a directory holding tokenizer.json (and
// optionally tokenizer_config.json), or a tokenizer.json file (its sibling tokenizer_config.json is
// read when present).
Result<Vocab> load_vocab(const std::string& path);
Result<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace dflash
