#include "tokenizer/gguf_vocab.h"

#include <exception>

namespace dflash {
namespace {

constexpr const char* kModel = "tokenizer.ggml.model";
constexpr const char* kPre = "tokenizer.ggml.pre";
constexpr const char* kTokens = "tokenizer.ggml.tokens";
constexpr const char* kTypes = "tokenizer.ggml.token_type";
constexpr const char* kMerges = "tokenizer.ggml.merges";
constexpr const char* kBos = "tokenizer.ggml.bos_token_id";
constexpr const char* kEos = "tokenizer.ggml.eos_token_id";
constexpr const char* kEot = "tokenizer.ggml.eot_token_id";
constexpr const char* kPad = "tokenizer.ggml.padding_token_id";
constexpr const char* kUnk = "tokenizer.ggml.unknown_token_id";
constexpr const char* kAddBos = "tokenizer.ggml.add_bos_token";
constexpr const char* kAddEos = "tokenizer.ggml.add_eos_token";

Result<const std::string*> get_string(const GgufLookup& find, const char* key) {
  const GgufValue* v = find(key);
  if (v == nullptr) return static_cast<const std::string*>(nullptr);
  if (v->as_string() == nullptr) return corrupt("gguf: '{}' must be a string, not {}", key, gguf_type_name(v->type()));
  return v->as_string();
}

Status get_id(const GgufLookup& find, const char* key, size_t n_tokens, std::optional<int32_t>& out) {
  const GgufValue* v = find(key);
  if (v == nullptr) return Status();
  auto i = v->as_int();
  if (!i || v->type() == GgufType::kBool)
    return corrupt("gguf: '{}' must be an integer, not {}", key, gguf_type_name(v->type()));
  if (*i < 0 || *i >= static_cast<int64_t>(n_tokens))
    return corrupt("gguf: '{}' is {}, outside the vocabulary [0, {})", key, *i, n_tokens);
  out = static_cast<int32_t>(*i);
  return Status();
}

Status get_flag(const GgufLookup& find, const char* key, bool& out) {
  const GgufValue* v = find(key);
  if (v == nullptr) return Status();
  auto b = v->as_bool();
  if (!b) return corrupt("gguf: '{}' must be a bool, not {}", key, gguf_type_name(v->type()));
  out = *b;
  return Status();
}

// convert_hf_to_gguf.py's does_token_look_special.
bool looks_special(std::string_view t) {
  auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.substr(0, open.size()) == open &&
           t.substr(t.size() - close.size()) == close;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wrapped("<unused", ">");
}

Result<Vocab> read(const GgufLookup& find) {
  DF_ASSIGN_OR_RETURN(const std::string* model, get_string(find, kModel));
  if (model == nullptr) return not_found("gguf: no tokenizer ('{}' is missing)", kModel);
  if (*model == "llama" || *model == "t5" || *model == "bert" || *model == "rwkv" || *model == "ugm")
    return unsupported("gguf: tokenizer model '{}' is not supported yet (only byte-level BPE, 'gpt2')", *model);
  if (*model != "gpt2") return unsupported("gguf: tokenizer model '{}' is not supported (only 'gpt2')", *model);

  DF_ASSIGN_OR_RETURN(const std::string* pre, get_string(find, kPre));
  if (pre == nullptr)
    return unsupported("gguf: no '{}': llama.cpp's 'default' pre-tokenizer is not supported", kPre);
  const PreTokenizerSpec* spec = find_pre_tokenizer(*pre);
  if (spec == nullptr)
    return unsupported("gguf: pre-tokenizer '{}' is not supported (known: qwen2, qwen35, llama-bpe, gpt2)", *pre);

  const GgufValue* tokens_v = find(kTokens);
  if (tokens_v == nullptr) return corrupt("gguf: '{}' is missing", kTokens);
  const auto* tokens = tokens_v->as_string_array();
  if (tokens == nullptr) return corrupt("gguf: '{}' must be an array of strings", kTokens);
  if (tokens->empty()) return corrupt("gguf: '{}' is empty", kTokens);
  if (static_cast<int64_t>(tokens->size()) > kMaxVocabTokens)
    return corrupt("gguf: {} tokens is more than the supported {}", tokens->size(), kMaxVocabTokens);

  Vocab v;
  v.tokens = *tokens;
  v.types.assign(tokens->size(), TokenType::kNormal);
  if (const GgufValue* types_v = find(kTypes)) {
    const auto* types = types_v->as_int_array();
    if (types == nullptr) return corrupt("gguf: '{}' must be an array of integers", kTypes);
    if (types->size() != tokens->size())
      return corrupt("gguf: {} token types for {} tokens", types->size(), tokens->size());
    for (size_t i = 0; i < types->size(); ++i) {
      int64_t t = (*types)[i];
      if (!is_valid_token_type(t)) return corrupt("gguf: token {} has invalid type {}", i, t);
      v.types[i] = static_cast<TokenType>(t);
    }
  }

  const GgufValue* merges_v = find(kMerges);
  if (merges_v == nullptr) return corrupt("gguf: '{}' is missing (a BPE vocabulary needs merges)", kMerges);
  const auto* merges = merges_v->as_string_array();
  if (merges == nullptr) return corrupt("gguf: '{}' must be an array of strings", kMerges);
  if (static_cast<int64_t>(merges->size()) > kMaxMerges)
    return corrupt("gguf: {} merges is more than the supported {}", merges->size(), kMaxMerges);
  v.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string& m = (*merges)[i];
    size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;  // as llama.cpp: the first space after byte 0
    if (sp == std::string::npos || sp + 1 >= m.size())
      return corrupt("gguf: merge {} '{}' is not two tokens separated by a space", i, m);
    v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }

  for (size_t i = 0; i < v.tokens.size(); ++i) {
    TokenType t = v.types[i];
    if (t == TokenType::kControl || t == TokenType::kUserDefined) {
      AddedToken a;
      a.id = static_cast<int32_t>(i);
      a.content = v.tokens[i];
      a.special = t == TokenType::kControl;
      v.added_tokens.push_back(std::move(a));
    } else if (t == TokenType::kUnknown && !v.unk_id) {
      v.unk_id = static_cast<int32_t>(i);
    }
  }

  DF_RETURN_IF_ERROR(get_id(find, kBos, v.tokens.size(), v.bos_id));
  DF_RETURN_IF_ERROR(get_id(find, kEos, v.tokens.size(), v.eos_id));
  DF_RETURN_IF_ERROR(get_id(find, kEot, v.tokens.size(), v.eot_id));
  DF_RETURN_IF_ERROR(get_id(find, kPad, v.tokens.size(), v.pad_id));
  DF_RETURN_IF_ERROR(get_id(find, kUnk, v.tokens.size(), v.unk_id));
  DF_RETURN_IF_ERROR(get_flag(find, kAddBos, v.add_bos));
  DF_RETURN_IF_ERROR(get_flag(find, kAddEos, v.add_eos));

  v.pre_name = *pre;
  v.split_regexes = {std::string(spec->regex)};
  v.nfc = spec->nfc;
  v.ignore_merges = spec->ignore_merges;
  DF_RETURN_IF_ERROR(v.validate());
  return v;
}

}  // namespace

Result<Vocab> vocab_from_gguf(const GgufLookup& find) {
  try {
    return read(find);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "gguf: out of memory reading the tokenizer");
  }
}

Result<Vocab> vocab_from_gguf(const GgufFile& file) {
  auto v = vocab_from_gguf([&](const std::string& key) { return file.find(key); });
  if (!v.ok() && !file.path().empty()) return v.status().with_context(file.path());
  return v;
}

Status write_tokenizer_to_gguf(const Vocab& vocab, int64_t model_vocab_size, GgufWriter& writer) {
  DF_RETURN_IF_ERROR(vocab.validate());
  if (vocab.pre_name.empty() || find_pre_tokenizer(vocab.pre_name) == nullptr)
    return unsupported("tokenizer: its pre-tokenizer regex is not a family GGUF can name (qwen2, qwen35, "
                       "llama-bpe, gpt2), so llama.cpp could not tokenize like it");
  if (vocab.split_regexes.size() != 1 || vocab.split_regexes[0] != find_pre_tokenizer(vocab.pre_name)->regex)
    return internal_error("tokenizer: pre-tokenizer '{}' does not match its regexes", vocab.pre_name);
  if (model_vocab_size < vocab.size())
    return invalid_argument("model vocabulary size {} is smaller than the tokenizer's {} tokens", model_vocab_size,
                            vocab.size());
  if (model_vocab_size > kMaxVocabTokens)
    return invalid_argument("model vocabulary size {} is more than the supported {}", model_vocab_size,
                            kMaxVocabTokens);

  size_t n = static_cast<size_t>(model_vocab_size);
  std::vector<std::string> tokens(n);
  std::vector<int64_t> types(n, static_cast<int64_t>(TokenType::kUnused));
  for (size_t i = 0; i < n; ++i) {
    if (i >= vocab.tokens.size() || vocab.types[i] == TokenType::kUnused) {
      tokens[i] = fmt::format("[PAD{}]", i);
      continue;
    }
    tokens[i] = vocab.tokens[i];
    TokenType t = vocab.types[i];
    if (t == TokenType::kUserDefined && looks_special(tokens[i])) t = TokenType::kControl;
    types[i] = static_cast<int64_t>(t);
  }
  std::vector<std::string> merges;
  merges.reserve(vocab.merges.size());
  for (const auto& [a, b] : vocab.merges) merges.push_back(a + " " + b);

  std::optional<int32_t> bos = vocab.bos_id;
  if (!bos && (vocab.pre_name == "qwen2" || vocab.pre_name == "qwen35")) bos = vocab.find_token("<|endoftext|>");

  writer.set(kModel, GgufValue::string("gpt2"));
  writer.set(kPre, GgufValue::string(vocab.pre_name));
  writer.set(kTokens, GgufValue::string_array(std::move(tokens)));
  writer.set(kTypes, GgufValue::int_array(GgufType::kI32, std::move(types)));
  writer.set(kMerges, GgufValue::string_array(std::move(merges)));
  auto set_id = [&](const char* key, const std::optional<int32_t>& id) {
    if (id) writer.set(key, GgufValue::u32(static_cast<uint32_t>(*id)));
  };
  set_id(kBos, bos);
  set_id(kEos, vocab.eos_id);
  set_id(kEot, vocab.eot_id);
  set_id(kUnk, vocab.unk_id);
  set_id(kPad, vocab.pad_id);
  writer.set(kAddBos, GgufValue::boolean(vocab.add_bos));
  if (vocab.add_eos) writer.set(kAddEos, GgufValue::boolean(true));
  return Status();
}

}  // namespace dflash
