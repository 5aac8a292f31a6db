// GGUF tokenizer metadata (tokenizer.ggml.*): read a Vocab from it, and write one as llama.cpp's converter does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "formats/gguf.h"
#include "tokenizer/vocab.h"

namespace dflash {

// Looks a metadata key up; nullptr when absent. Lets the reader work on a GgufFile or a GgufWriter.
using GgufLookup = std::function<const GgufValue*(const std::string& key)>;

// Reads tokenizer.ggml.{model, pre, tokens, token_type, merges, bos/eos/eot/padding/unknown_token_id,
// add_bos_token, add_eos_token} (the chat template is chat_template.h's business). model must be "gpt2" (byte-level BPE);
// pre must be a known family (qwen2, qwen35, llama-bpe, gpt2). Control tokens become special added tokens and user-defined tokens non-special ones.
// GGUF has no normalizer key: NFC is applied when the family's HF tokenizer applies it (qwen2, qwen35),
// which matches HF tokenizers (llama.cpp itself skips NFC; the two differ only on non-NFC input).
Result<Vocab> vocab_from_gguf(const GgufLookup& find);
Result<Vocab> vocab_from_gguf(const GgufFile& file);

// Writes the tokenizer keys as llama.cpp's convert_hf_to_gguf.py does for byte-level BPE: model "gpt2",
// pre (the vocabulary's family; an unnamed regex is refused), tokens padded to `model_vocab_size` with
// "[PAD{i}]" of type kUnused, kControl for special added tokens and for added tokens that look special
// (<|...|>, as the converter's does_token_look_special), kUserDefined for other added tokens, merges as
// "a b", bos (the vocabulary's, else <|endoftext|> for Qwen families, as real Qwen GGUFs carry), eos,
// eot, padding and unknown ids when known, add_bos_token (and add_eos_token when true). The chat
// template is left to the caller.
Status write_tokenizer_to_gguf(const Vocab& vocab, int64_t model_vocab_size, GgufWriter& writer);

}  // namespace dflash
