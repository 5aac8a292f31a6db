#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>

#include "base/file_io.h"
#include "formats/gguf.h"
#include "formats/untrusted_json.h"
#include "tokenizer/jinja/error.h"

namespace dflash {
namespace {

constexpr size_t kMaxTemplateFileBytes = size_t{16} << 20;
constexpr size_t kMaxTokenizerConfigBytes = size_t{256} << 20;

// OpenAI sends tool-call arguments as a JSON string; templates expect the object.
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = messages;
  for (auto& m : out) {
    if (!m.is_object()) continue;
    auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    for (auto& call : *calls) {
      if (!call.is_object()) continue;
      auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) continue;
      auto args = fn->find("arguments");
      if (args == fn->end() || !args->is_string()) continue;
      const std::string& text = args->get_ref<const std::string&>();
      auto parsed = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_object()) *args = std::move(parsed);
    }
  }
  return out;
}

// tokenizer_config.json stores special tokens as a string or as an AddedToken {"content": ...}.
std::string token_text(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

Status read_template_field(const nlohmann::json& value, const std::string& what, ChatTemplateSource& out) {
  if (value.is_string()) {
    out.source = value.get<std::string>();
    return Status();
  }
  if (!value.is_array()) return corrupt("{}: chat_template must be a string or a list, not {}", what, json_type_name(value));
  std::string first;
  for (const auto& entry : value) {
    if (!entry.is_object()) return corrupt("{}: chat_template list entries must be objects", what);
    auto name = entry.find("name");
    auto tmpl = entry.find("template");
    if (name == entry.end() || !name->is_string() || tmpl == entry.end() || !tmpl->is_string()) {
      return corrupt("{}: chat_template list entries need string 'name' and 'template'", what);
    }
    const std::string& n = name->get_ref<const std::string&>();
    if (n == "default") out.source = tmpl->get<std::string>();
    if (n == "tool_use") out.tool_use_source = tmpl->get<std::string>();
    if (first.empty()) first = tmpl->get<std::string>();
  }
  if (out.source.empty()) {
    if (out.tool_use_source.empty() && first.empty()) return corrupt("{}: chat_template list is empty", what);
    // transformers needs "default" unless a tool_use request picks the tool_use template.
    out.source = out.tool_use_source.empty() ? first : out.tool_use_source;
  }
  return Status();
}

Result<ChatTemplateSource> load_from_hf_dir(const std::string& dir) {
  ChatTemplateSource out;
  const std::string config_path = path_join(dir, "tokenizer_config.json");
  nlohmann::json config = nlohmann::json::object();
  if (file_exists(config_path)) {
    DF_ASSIGN_OR_RETURN(std::string text, read_text_file(config_path, kMaxTokenizerConfigBytes));
    DF_ASSIGN_OR_RETURN(config, parse_untrusted_json(text, config_path));
    if (!config.is_object()) return corrupt("{}: expected a JSON object", config_path);
    out.bos_token = token_text(config, "bos_token");
    out.eos_token = token_text(config, "eos_token");
  }
  const std::string jinja_path = path_join(dir, "chat_template.jinja");
  if (file_exists(jinja_path)) {
    DF_ASSIGN_OR_RETURN(out.source, read_text_file(jinja_path, kMaxTemplateFileBytes));
    out.origin = jinja_path;
    return out;
  }
  if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    DF_RETURN_IF_ERROR(read_template_field(*it, config_path, out));
    out.origin = config_path;
    return out;
  }
  const std::string processor_path = path_join(dir, "chat_template.json");
  if (file_exists(processor_path)) {
    DF_ASSIGN_OR_RETURN(std::string text, read_text_file(processor_path, kMaxTemplateFileBytes));
    DF_ASSIGN_OR_RETURN(nlohmann::json j, parse_untrusted_json(text, processor_path));
    if (j.is_object()) {
      if (auto it = j.find("chat_template"); it != j.end()) {
        DF_RETURN_IF_ERROR(read_template_field(*it, processor_path, out));
        out.origin = processor_path;
        return out;
      }
    }
  }
  return not_found("no chat template in '{}' (looked for chat_template.jinja, tokenizer_config.json's "
                   "chat_template and chat_template.json)", dir);
}

Result<std::string> gguf_token(const GgufFile& gguf, const char* id_key) {
  DF_ASSIGN_OR_RETURN(std::optional<int64_t> id, gguf.get_int(id_key));
  if (!id) return std::string();
  const GgufValue* tokens = gguf.find("tokenizer.ggml.tokens");
  const std::vector<std::string>* list = tokens ? tokens->as_string_array() : nullptr;
  if (!list) return std::string();
  if (*id < 0 || static_cast<uint64_t>(*id) >= list->size()) {
    return corrupt("{}: {} = {} is outside the vocabulary of {} tokens", gguf.path(), id_key, *id, list->size());
  }
  return (*list)[static_cast<size_t>(*id)];
}

Result<ChatTemplateSource> load_from_gguf(const std::string& path) {
  DF_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::open(path));
  ChatTemplateSource out;
  DF_ASSIGN_OR_RETURN(std::optional<std::string> source, gguf.get_string("tokenizer.chat_template"));
  DF_ASSIGN_OR_RETURN(std::optional<std::string> tool_use, gguf.get_string("tokenizer.chat_template.tool_use"));
  if (!source && !tool_use) return not_found("{}: no tokenizer.chat_template in the GGUF metadata", path);
  out.source = source ? *source : *tool_use;
  if (tool_use) out.tool_use_source = *tool_use;
  DF_ASSIGN_OR_RETURN(out.bos_token, gguf_token(gguf, "tokenizer.ggml.bos_token_id"));
  DF_ASSIGN_OR_RETURN(out.eos_token, gguf_token(gguf, "tokenizer.ggml.eos_token_id"));
  out.origin = path + ": tokenizer.chat_template";
  return out;
}

// The two JSON types share no converting constructor; copy structurally (no text round trip, so
// strings that are not valid UTF-8 survive).
nlohmann::ordered_json to_ordered(const nlohmann::json& j, int depth = 0) {
  if (depth > 256) throw jinja::Error(jinja::ErrorKind::kLimit, "JSON input nested too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::object: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [k, v] : j.items()) o[k] = to_ordered(v, depth + 1);
      return o;
    }
    case nlohmann::json::value_t::array: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const auto& v : j) a.push_back(to_ordered(v, depth + 1));
      return a;
    }
    case nlohmann::json::value_t::string: return j.get<std::string>();
    case nlohmann::json::value_t::boolean: return j.get<bool>();
    case nlohmann::json::value_t::number_integer: return j.get<int64_t>();
    case nlohmann::json::value_t::number_unsigned: return j.get<uint64_t>();
    case nlohmann::json::value_t::number_float: return j.get<double>();
    default: return nullptr;
  }
}

bool looks_like_gguf(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  return f.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

}  // namespace

Result<ChatTemplateSource> load_chat_template(const std::string& model_path) {
  if (is_directory(model_path)) return load_from_hf_dir(model_path);
  if (!file_exists(model_path)) return not_found("model path '{}' does not exist", model_path);
  if (!looks_like_gguf(model_path)) {
    // A weights file of an HF model (model.safetensors): its directory holds the template.
    std::string dir = std::filesystem::path(model_path).parent_path().string();
    return load_from_hf_dir(dir.empty() ? "." : dir);
  }
  return load_from_gguf(model_path);
}

Result<ChatTemplate> ChatTemplate::create(std::string_view source, std::string bos_token, std::string eos_token,
                                          const jinja::Limits& limits) {
  Result<jinja::Template> t = jinja::Template::parse(source, limits);
  if (!t.ok()) return t.status().with_context("chat template");
  return ChatTemplate(std::move(t).value(), std::nullopt, std::move(bos_token), std::move(eos_token));
}

Result<ChatTemplate> ChatTemplate::create(const ChatTemplateSource& source, const jinja::Limits& limits) {
  Result<jinja::Template> t = jinja::Template::parse(source.source, limits);
  if (!t.ok()) return t.status().with_context(source.origin + ": chat template");
  std::optional<jinja::Template> tool_use;
  if (!source.tool_use_source.empty()) {
    Result<jinja::Template> tu = jinja::Template::parse(source.tool_use_source, limits);
    if (!tu.ok()) return tu.status().with_context(source.origin + ": tool_use chat template");
    tool_use = std::move(tu).value();
  }
  return ChatTemplate(std::move(t).value(), std::move(tool_use), source.bos_token, source.eos_token);
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                         bool add_generation_prompt,
                                         const nlohmann::ordered_json& extra_kwargs) const {
  if (!messages.is_array()) return invalid_argument("messages must be an array");
  if (!tools.is_null() && !tools.is_array()) return invalid_argument("tools must be an array or null");
  if (!extra_kwargs.is_null() && !extra_kwargs.is_object()) {
    return invalid_argument("chat_template_kwargs must be an object");
  }
  jinja::Dict context;
  try {
    context.set("messages", jinja::from_json(normalize_messages(messages)));
    context.set("tools", jinja::from_json(tools));
    context.set("documents", jinja::Value::none());
    context.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
    if (!bos_token_.empty()) context.set("bos_token", jinja::Value::string(bos_token_));
    if (!eos_token_.empty()) context.set("eos_token", jinja::Value::string(eos_token_));
    if (extra_kwargs.is_object()) {
      for (const auto& [key, value] : extra_kwargs.items()) {
        if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt") {
          return invalid_argument("chat_template_kwargs may not set '{}'", key);
        }
        context.set(std::string(key), jinja::from_json(value));
      }
    }
  } catch (const jinja::Error& e) {
    return invalid_argument("chat request: {}", e.message());
  }
  const jinja::Template& t = (!tools.is_null() && tool_use_) ? *tool_use_ : default_;
  jinja::RenderOptions options;
  options.now = fixed_time_;
  return t.render(context, options);
}

Result<std::string> ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                         bool add_generation_prompt, const nlohmann::json& extra_kwargs) const {
  try {
    return render(to_ordered(messages), to_ordered(tools), add_generation_prompt, to_ordered(extra_kwargs));
  } catch (const jinja::Error& e) {
    return invalid_argument("chat request: {}", e.message());
  }
}

}  // namespace dflash
