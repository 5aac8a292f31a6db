#include "tokenizer/load_tokenizer.h"

#include "base/file_io.h"
#include "formats/gguf.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/tokenizer_json.h"

namespace dflash {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

Result<Vocab> load_vocab(const std::string& path) {
  if (is_directory(path)) {
    if (!file_exists(path_join(path, "tokenizer.json")))
      return not_found("'{}' has no tokenizer.json (a model directory needs one, or give a GGUF file)", path);
    return load_tokenizer_json_dir(path);
  }
  if (!file_exists(path)) return not_found("'{}' does not exist", path);
  if (ends_with(path, ".json")) {
    DF_ASSIGN_OR_RETURN(std::string text, read_text_file(path, kMaxTokenizerJsonBytes));
    std::string config;
    std::string config_path = path_join(parent_dir(path), "tokenizer_config.json");
    if (file_exists(config_path)) {
      DF_ASSIGN_OR_RETURN(config, read_text_file(config_path, kMaxTokenizerJsonBytes));
    }
    auto v = vocab_from_tokenizer_json(text, config);
    if (!v.ok()) return v.status().with_context(path);
    return v;
  }
  DF_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  return vocab_from_gguf(file);
}

Result<Tokenizer> load_tokenizer(const std::string& path) {
  DF_ASSIGN_OR_RETURN(Vocab vocab, load_vocab(path));
  auto t = Tokenizer::create(std::move(vocab));
  if (!t.ok()) return t.status().with_context(path);
  return t;
}

}  // namespace dflash
