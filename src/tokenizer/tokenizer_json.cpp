#include "tokenizer/tokenizer_json.h"

#include <algorithm>
#include <exception>
#include <unordered_map>

#include "base/file_io.h"
#include "formats/untrusted_json.h"
#include "tokenizer/utf8.h"

namespace dflash {
namespace {

using json = nlohmann::json;

// The member `key` of object `obj`, or nullptr when absent or null.
const json* member(const json& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Status type_error(std::string_view where, std::string_view key, std::string_view want, const json& got) {
  return corrupt("{}: '{}' must be {}, not {}", where, key, want, json_type_name(got));
}

Status read_bool(const json& obj, std::string_view key, std::string_view where, bool& out) {
  const json* v = member(obj, key);
  if (v == nullptr) return Status();
  if (!v->is_boolean()) return type_error(where, key, "a boolean", *v);
  out = v->get<bool>();
  return Status();
}

Result<const std::string*> read_string(const json& obj, std::string_view key, std::string_view where) {
  const json* v = member(obj, key);
  if (v == nullptr) return static_cast<const std::string*>(nullptr);
  if (!v->is_string()) return type_error(where, key, "a string", *v);
  return v->get_ptr<const std::string*>();
}

Result<int64_t> to_id(const json& v, std::string_view where) {
  if (!v.is_number_integer()) return corrupt("{}: token id must be an integer, not {}", where, json_type_name(v));
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u >= static_cast<uint64_t>(kMaxVocabTokens))
      return corrupt("{}: token id {} is beyond the supported {} tokens", where, u, kMaxVocabTokens);
    return static_cast<int64_t>(u);
  }
  int64_t i = v.get<int64_t>();
  if (i < 0 || i >= kMaxVocabTokens)
    return corrupt("{}: token id {} is outside [0, {})", where, i, kMaxVocabTokens);
  return i;
}

struct Parsed {
  std::vector<std::pair<int32_t, std::string>> model_tokens;  // (id, spelling), sorted by id
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedToken> added;
  std::vector<std::string> split_regexes;
  bool nfc = false;
  bool ignore_merges = false;
  bool byte_fallback = false;
  std::optional<std::string> unk_token;
};

Status parse_model(const json& root, Parsed& p) {
  const json* model = member(root, "model");
  if (model == nullptr) return corrupt("tokenizer.json: no 'model' object");
  if (!model->is_object()) return type_error("tokenizer.json", "model", "an object", *model);
  DF_ASSIGN_OR_RETURN(const std::string* type, read_string(*model, "type", "tokenizer.json model"));
  if (type != nullptr && *type != "BPE")
    return unsupported("tokenizer.json: model type '{}' is not supported (only BPE is)", *type);
  DF_RETURN_IF_ERROR(read_bool(*model, "byte_fallback", "tokenizer.json model", p.byte_fallback));
  DF_RETURN_IF_ERROR(read_bool(*model, "ignore_merges", "tokenizer.json model", p.ignore_merges));
  bool fuse_unk = false;
  DF_RETURN_IF_ERROR(read_bool(*model, "fuse_unk", "tokenizer.json model", fuse_unk));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    DF_ASSIGN_OR_RETURN(const std::string* s, read_string(*model, key, "tokenizer.json model"));
    if (s != nullptr && !s->empty())
      return unsupported("tokenizer.json: BPE with a {} ('{}') is not supported", key, *s);
  }
  if (const json* d = member(*model, "dropout")) {
    if (!d->is_number()) return type_error("tokenizer.json model", "dropout", "a number or null", *d);
    if (d->get<double>() != 0.0) return unsupported("tokenizer.json: BPE dropout is for training, not supported");
  }
  DF_ASSIGN_OR_RETURN(const std::string* unk, read_string(*model, "unk_token", "tokenizer.json model"));
  if (unk != nullptr) {
    if (fuse_unk) return unsupported("tokenizer.json: fuse_unk is not supported");
    p.unk_token = *unk;
  }

  const json* vocab = member(*model, "vocab");
  if (vocab == nullptr) return corrupt("tokenizer.json: model has no 'vocab'");
  if (!vocab->is_object()) return type_error("tokenizer.json model", "vocab", "an object", *vocab);
  if (static_cast<int64_t>(vocab->size()) > kMaxVocabTokens)
    return corrupt("tokenizer.json: {} vocabulary entries is more than the supported {}", vocab->size(),
                   kMaxVocabTokens);
  p.model_tokens.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const json& value = it.value();
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= static_cast<uint64_t>(kMaxVocabTokens)) {
      auto id = to_id(value, fmt::format("tokenizer.json vocab entry '{}'", it.key()));
      if (!id.ok()) return id.status();
    }
    p.model_tokens.emplace_back(static_cast<int32_t>(value.get<uint64_t>()), it.key());
  }
  std::sort(p.model_tokens.begin(), p.model_tokens.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  for (size_t i = 1; i < p.model_tokens.size(); ++i) {
    if (p.model_tokens[i].first == p.model_tokens[i - 1].first)
      return corrupt("tokenizer.json: vocab id {} is given to both '{}' and '{}'", p.model_tokens[i].first,
                     p.model_tokens[i - 1].second, p.model_tokens[i].second);
  }

  const json* merges = member(*model, "merges");
  if (merges == nullptr) return Status();
  if (!merges->is_array()) return type_error("tokenizer.json model", "merges", "an array", *merges);
  if (static_cast<int64_t>(merges->size()) > kMaxMerges)
    return corrupt("tokenizer.json: {} merges is more than the supported {}", merges->size(), kMaxMerges);
  p.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& m = (*merges)[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos)
        return corrupt("tokenizer.json: merge {} '{}' is not two tokens separated by one space", i, s);
      p.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      p.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return corrupt("tokenizer.json: merge {} must be a string \"a b\" or a pair [\"a\", \"b\"]", i);
    }
  }
  return Status();
}

Result<AddedToken> parse_added_token(const json& t, std::string_view where) {
  if (!t.is_object()) return corrupt("{} must be an object, not {}", where, json_type_name(t));
  AddedToken a;
  const json* id = member(t, "id");
  if (id == nullptr) return corrupt("{} has no 'id'", where);
  DF_ASSIGN_OR_RETURN(int64_t v, to_id(*id, where));
  a.id = static_cast<int32_t>(v);
  DF_ASSIGN_OR_RETURN(const std::string* content, read_string(t, "content", where));
  if (content == nullptr || content->empty()) return corrupt("{} (id {}) has no content", where, a.id);
  a.content = *content;
  DF_RETURN_IF_ERROR(read_bool(t, "special", where, a.special));
  a.normalized = !a.special;  // HF's default
  DF_RETURN_IF_ERROR(read_bool(t, "normalized", where, a.normalized));
  DF_RETURN_IF_ERROR(read_bool(t, "lstrip", where, a.lstrip));
  DF_RETURN_IF_ERROR(read_bool(t, "rstrip", where, a.rstrip));
  DF_RETURN_IF_ERROR(read_bool(t, "single_word", where, a.single_word));
  return a;
}

Status parse_normalizer(const json& n, Parsed& p) {
  if (!n.is_object()) return type_error("tokenizer.json", "normalizer", "an object", n);
  DF_ASSIGN_OR_RETURN(const std::string* type, read_string(n, "type", "tokenizer.json normalizer"));
  if (type == nullptr) return corrupt("tokenizer.json: normalizer has no type");
  if (*type == "NFC") {
    p.nfc = true;
    return Status();
  }
  if (*type == "Sequence") {
    const json* list = member(n, "normalizers");
    if (list == nullptr || !list->is_array()) return corrupt("tokenizer.json: normalizer Sequence needs 'normalizers'");
    for (const json& sub : *list) DF_RETURN_IF_ERROR(parse_normalizer(sub, p));
    return Status();
  }
  return unsupported("tokenizer.json: normalizer '{}' is not supported (only NFC)", *type);
}

// Walks the pre-tokenizer tree: Split steps become regexes; ByteLevel must come last.
Status parse_pre_tokenizer(const json& t, Parsed& p, bool& byte_level) {
  if (!t.is_object()) return type_error("tokenizer.json", "pre_tokenizer", "an object", t);
  DF_ASSIGN_OR_RETURN(const std::string* type, read_string(t, "type", "tokenizer.json pre_tokenizer"));
  if (type == nullptr) return corrupt("tokenizer.json: pre_tokenizer has no type");
  if (byte_level) return unsupported("tokenizer.json: pre-tokenizer '{}' after ByteLevel is not supported", *type);
  if (*type == "Sequence") {
    const json* list = member(t, "pretokenizers");
    if (list == nullptr || !list->is_array())
      return corrupt("tokenizer.json: pre_tokenizer Sequence needs 'pretokenizers'");
    for (const json& sub : *list) DF_RETURN_IF_ERROR(parse_pre_tokenizer(sub, p, byte_level));
    return Status();
  }
  if (*type == "ByteLevel") {
    bool prefix = false, use_regex = true;
    DF_RETURN_IF_ERROR(read_bool(t, "add_prefix_space", "tokenizer.json ByteLevel", prefix));
    DF_RETURN_IF_ERROR(read_bool(t, "use_regex", "tokenizer.json ByteLevel", use_regex));
    if (prefix) return unsupported("tokenizer.json: ByteLevel add_prefix_space is not supported");
    if (use_regex) p.split_regexes.emplace_back(gpt2_split_regex());
    byte_level = true;
    return Status();
  }
  if (*type == "Split") {
    const json* pattern = member(t, "pattern");
    if (pattern == nullptr || !pattern->is_object()) return corrupt("tokenizer.json: Split needs a 'pattern' object");
    DF_ASSIGN_OR_RETURN(const std::string* behavior, read_string(t, "behavior", "tokenizer.json Split"));
    if (behavior == nullptr || *behavior != "Isolated")
      return unsupported("tokenizer.json: Split behavior '{}' is not supported (only Isolated)",
                         behavior ? *behavior : "");
    bool invert = false;
    DF_RETURN_IF_ERROR(read_bool(t, "invert", "tokenizer.json Split", invert));
    if (invert) return unsupported("tokenizer.json: inverted Split is not supported");
    DF_ASSIGN_OR_RETURN(const std::string* regex, read_string(*pattern, "Regex", "tokenizer.json Split pattern"));
    DF_ASSIGN_OR_RETURN(const std::string* literal, read_string(*pattern, "String", "tokenizer.json Split pattern"));
    if (regex != nullptr) {
      p.split_regexes.push_back(*regex);
    } else if (literal != nullptr && !literal->empty()) {
      // A literal: quoted with \Q...\E, any "\E" inside it closed and reopened around an escaped '\'.
      std::string quoted = "\\Q";
      for (size_t i = 0; i < literal->size(); ++i) {
        if ((*literal)[i] == '\\' && i + 1 < literal->size() && (*literal)[i + 1] == 'E') {
          quoted += "\\E\\\\\\QE";
          ++i;
        } else {
          quoted += (*literal)[i];
        }
      }
      p.split_regexes.push_back(quoted + "\\E");
    } else {
      return corrupt("tokenizer.json: Split pattern needs a 'Regex' or a non-empty 'String'");
    }
    return Status();
  }
  return unsupported("tokenizer.json: pre-tokenizer '{}' is not supported", *type);
}

Status parse_decoder(const json& d) {
  if (!d.is_object()) return type_error("tokenizer.json", "decoder", "an object", d);
  DF_ASSIGN_OR_RETURN(const std::string* type, read_string(d, "type", "tokenizer.json decoder"));
  if (type != nullptr && *type == "ByteLevel") return Status();
  return unsupported("tokenizer.json: decoder '{}' is not supported (only ByteLevel)", type ? *type : "");
}

// A special token named in tokenizer_config.json: a string, an {"content": ...} object, or null.
Result<std::optional<std::string>> config_token(const json& cfg, std::string_view key) {
  const json* v = member(cfg, key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->is_string()) return std::optional<std::string>(v->get<std::string>());
  if (v->is_object()) {
    DF_ASSIGN_OR_RETURN(const std::string* c, read_string(*v, "content", "tokenizer_config.json"));
    if (c != nullptr) return std::optional<std::string>(*c);
  }
  return corrupt("tokenizer_config.json: '{}' must be a string or an object with 'content'", key);
}

Status apply_config(const json& cfg, Vocab& v, std::vector<AddedToken>& extra_added) {
  if (!cfg.is_object()) return corrupt("tokenizer_config.json: the top level must be an object");
  DF_RETURN_IF_ERROR(read_bool(cfg, "add_bos_token", "tokenizer_config.json", v.add_bos));
  DF_RETURN_IF_ERROR(read_bool(cfg, "add_eos_token", "tokenizer_config.json", v.add_eos));
  if (const json* dec = member(cfg, "added_tokens_decoder")) {
    if (!dec->is_object()) return type_error("tokenizer_config.json", "added_tokens_decoder", "an object", *dec);
    if (static_cast<int64_t>(dec->size()) > kMaxVocabTokens) return corrupt("tokenizer_config.json: too many added tokens");
    for (auto it = dec->begin(); it != dec->end(); ++it) {
      std::string where = fmt::format("tokenizer_config.json added token '{}'", it.key());
      const std::string& key = it.key();
      if (key.empty() || key.size() > 9 || !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return corrupt("{}: the key must be a token id", where);
      json with_id = it.value();
      if (!with_id.is_object()) return corrupt("{} must be an object", where);
      with_id["id"] = std::stoll(key);
      DF_ASSIGN_OR_RETURN(AddedToken a, parse_added_token(with_id, where));
      extra_added.push_back(std::move(a));
    }
  }
  return Status();
}

Result<Vocab> build(std::string_view tokenizer_json, std::string_view config_json) {
  DF_ASSIGN_OR_RETURN(json root, parse_untrusted_json(tokenizer_json, "tokenizer.json"));
  if (!root.is_object()) return corrupt("tokenizer.json: the top level must be an object");
  Parsed p;
  DF_RETURN_IF_ERROR(parse_model(root, p));
  if (const json* n = member(root, "normalizer")) DF_RETURN_IF_ERROR(parse_normalizer(*n, p));
  bool byte_level = false;
  if (const json* t = member(root, "pre_tokenizer")) DF_RETURN_IF_ERROR(parse_pre_tokenizer(*t, p, byte_level));
  if (!byte_level)
    return unsupported("tokenizer.json: no ByteLevel pre-tokenizer; only byte-level BPE vocabularies are supported");
  if (const json* d = member(root, "decoder")) DF_RETURN_IF_ERROR(parse_decoder(*d));
  if (const json* added = member(root, "added_tokens")) {
    if (!added->is_array()) return type_error("tokenizer.json", "added_tokens", "an array", *added);
    if (static_cast<int64_t>(added->size()) > kMaxVocabTokens) return corrupt("tokenizer.json: too many added tokens");
    for (size_t i = 0; i < added->size(); ++i) {
      DF_ASSIGN_OR_RETURN(AddedToken a, parse_added_token((*added)[i], fmt::format("tokenizer.json added_tokens[{}]", i)));
      p.added.push_back(std::move(a));
    }
  }

  Vocab v;
  std::vector<AddedToken> extra_added;
  json cfg;
  if (!config_json.empty()) {
    DF_ASSIGN_OR_RETURN(cfg, parse_untrusted_json(config_json, "tokenizer_config.json"));
    DF_RETURN_IF_ERROR(apply_config(cfg, v, extra_added));
  }
  // Config tokens only add ids tokenizer.json lacks; for the others they must agree on the content.
  std::unordered_map<int32_t, size_t> added_index;
  for (size_t i = 0; i < p.added.size(); ++i) {
    if (!added_index.emplace(p.added[i].id, i).second)
      return corrupt("tokenizer.json: two added tokens have id {}", p.added[i].id);
  }
  for (AddedToken& a : extra_added) {
    auto it = added_index.find(a.id);
    if (it == added_index.end()) {
      added_index.emplace(a.id, p.added.size());
      p.added.push_back(std::move(a));
    } else if (p.added[it->second].content != a.content) {
      return corrupt("tokenizer_config.json: added token {} is '{}' but tokenizer.json says '{}'", a.id, a.content,
                     p.added[it->second].content);
    }
  }
  std::sort(p.added.begin(), p.added.end(), [](const AddedToken& x, const AddedToken& y) { return x.id < y.id; });

  int64_t size = 0;
  if (!p.model_tokens.empty()) size = p.model_tokens.back().first + int64_t{1};
  for (const AddedToken& a : p.added) size = std::max<int64_t>(size, a.id + int64_t{1});
  if (size == 0) return corrupt("tokenizer.json: the vocabulary is empty");
  v.tokens.assign(static_cast<size_t>(size), std::string());
  v.types.assign(static_cast<size_t>(size), TokenType::kUnused);
  for (auto& [id, tok] : p.model_tokens) {
    v.tokens[id] = std::move(tok);
    v.types[id] = TokenType::kNormal;
  }
  for (const AddedToken& a : p.added) {
    if (v.types[a.id] == TokenType::kNormal && v.tokens[a.id] != a.content)
      return corrupt("tokenizer.json: added token {} '{}' collides with model token '{}'", a.id, a.content,
                     v.tokens[a.id]);
    v.tokens[a.id] = a.content;
    v.types[a.id] = a.special ? TokenType::kControl : TokenType::kUserDefined;
  }
  v.added_tokens = std::move(p.added);
  v.merges = std::move(p.merges);
  v.split_regexes = std::move(p.split_regexes);
  v.nfc = p.nfc;
  v.ignore_merges = p.ignore_merges;
  v.byte_fallback = p.byte_fallback;
  if (v.split_regexes.size() == 1) {
    if (const PreTokenizerSpec* spec = find_pre_tokenizer_by_regex(v.split_regexes[0])) {
      v.pre_name = std::string(spec->gguf_name);
    }
  }

  // Names -> ids, looking at added tokens first (their content is plain text).
  std::unordered_map<std::string_view, int32_t> by_text;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.types[i] != TokenType::kUnused) by_text.emplace(v.tokens[i], static_cast<int32_t>(i));
  }
  for (const AddedToken& a : v.added_tokens) by_text[a.content] = a.id;
  if (p.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      auto it = by_text.find(fmt::format("<0x{:02X}>", b));
      if (it != by_text.end() && v.types[it->second] == TokenType::kNormal) v.types[it->second] = TokenType::kByte;
    }
  }
  auto resolve = [&](const std::optional<std::string>& name, std::string_view what,
                     std::optional<int32_t>& out) -> Status {
    if (!name) return Status();
    auto it = by_text.find(*name);
    if (it == by_text.end()) return corrupt("{} '{}' is not in the vocabulary", what, *name);
    out = it->second;
    return Status();
  };
  DF_RETURN_IF_ERROR(resolve(p.unk_token, "tokenizer.json unk_token", v.unk_id));
  if (v.unk_id && v.types[*v.unk_id] == TokenType::kNormal) v.types[*v.unk_id] = TokenType::kUnknown;
  if (!config_json.empty()) {
    struct Named {
      const char* key;
      std::optional<int32_t>* id;
    };
    for (Named n : {Named{"bos_token", &v.bos_id}, Named{"eos_token", &v.eos_id}, Named{"pad_token", &v.pad_id},
                    Named{"unk_token", &v.unk_id}}) {
      DF_ASSIGN_OR_RETURN(std::optional<std::string> name, config_token(cfg, n.key));
      DF_RETURN_IF_ERROR(resolve(name, fmt::format("tokenizer_config.json {}", n.key), *n.id));
    }
  }
  DF_RETURN_IF_ERROR(v.validate());
  return v;
}

}  // namespace

Result<Vocab> vocab_from_tokenizer_json(std::string_view tokenizer_json, std::string_view config_json) {
  // Every access above checks types first; this only guards against what cannot be ruled out
  // statically (allocation failure on a huge file).
  try {
    return build(tokenizer_json, config_json);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "tokenizer.json: out of memory");
  } catch (const std::exception& e) {
    return corrupt("tokenizer.json: {}", e.what());
  }
}

Result<Vocab> load_tokenizer_json_dir(const std::string& dir) {
  std::string path = path_join(dir, "tokenizer.json");
  DF_ASSIGN_OR_RETURN(std::string text, read_text_file(path, kMaxTokenizerJsonBytes));
  std::string config;
  std::string config_path = path_join(dir, "tokenizer_config.json");
  if (file_exists(config_path)) {
    DF_ASSIGN_OR_RETURN(config, read_text_file(config_path, kMaxTokenizerJsonBytes));
  }
  auto v = vocab_from_tokenizer_json(text, config);
  if (!v.ok()) return v.status().with_context(dir);
  return v;
}

}  // namespace dflash
