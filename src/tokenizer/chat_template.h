// Chat templates: finding a model's template (GGUF or HF directory) and rendering an OpenAI-style
// request with it exactly as transformers' apply_chat_template would (byte-identical prompts).
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/jinja/template.h"

namespace dflash {

// A model's chat template and the special tokens transformers passes to it.
struct ChatTemplateSource {
  std::string source;           // the default template
  std::string tool_use_source;  // a named "tool_use" variant (used when the request has tools), or ""
  std::string bos_token;        // "" when the model defines none (the variable then stays undefined)
  std::string eos_token;
  std::string origin;           // where it was found, for messages ("x/tokenizer_config.json")
};

// Looks up the chat template of `model_path`:
//  - a GGUF file: metadata `tokenizer.chat_template` (and `tokenizer.chat_template.tool_use`), with
//    bos/eos from `tokenizer.ggml.{bos,eos}_token_id` and `tokenizer.ggml.tokens`;
//  - an HF model directory: `chat_template.jinja` if present, else `tokenizer_config.json`'s
//    `chat_template` (a string, or a list of {name, template} where "default" and "tool_use" are
//    used), else `chat_template.json` (processors); bos/eos from `tokenizer_config.json`;
//  - any other file (model.safetensors): the HF directory it is in.
Result<ChatTemplateSource> load_chat_template(const std::string& model_path);

class ChatTemplate {
 public:
  // Parses the template once. Empty bos/eos strings leave those variables undefined.
  static Result<ChatTemplate> create(std::string_view source, std::string bos_token, std::string eos_token,
                                     const jinja::Limits& limits = {});
  static Result<ChatTemplate> create(const ChatTemplateSource& source, const jinja::Limits& limits = {});

  // Renders an OpenAI chat request the way transformers' apply_chat_template renders it: the template
  // sees `messages`, `tools` (None when null), `documents` (None), `add_generation_prompt`,
  // `bos_token`/`eos_token`, and every key of `extra_kwargs` (the request's chat_template_kwargs,
  // e.g. enable_thinking), which may override bos/eos but not the other names.
  //
  // Messages pass through unchanged (content may be a string, null or an array of content parts),
  // with one normalization, as llama.cpp also does: an assistant tool call whose
  // `function.arguments` is a string holding a JSON object is given to the template as that object.
  // OpenAI clients send arguments as a JSON string, while templates (Qwen's among them) iterate
  // them as a mapping, which is what transformers users pass. Other strings stay strings.
  //
  // JSON key order matters (tojson prints keys in order): pass the request parsed as ordered_json.
  Result<std::string> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                             bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs) const;
  // Same, for a request parsed into nlohmann::json; its objects' keys are in sorted order, not the
  // client's, which changes what tojson prints.
  Result<std::string> render(const nlohmann::json& messages, const nlohmann::json& tools, bool add_generation_prompt,
                             const nlohmann::json& extra_kwargs) const;

  // Freezes what strftime_now() returns (reproducible prompts in tests); unset: the current time.
  void set_fixed_time(std::optional<std::time_t> t) { fixed_time_ = t; }

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  ChatTemplate(jinja::Template default_template, std::optional<jinja::Template> tool_use, std::string bos,
               std::string eos)
      : default_(std::move(default_template)),
        tool_use_(std::move(tool_use)),
        bos_token_(std::move(bos)),
        eos_token_(std::move(eos)) {}

  jinja::Template default_;
  std::optional<jinja::Template> tool_use_;
  std::string bos_token_;
  std::string eos_token_;
  std::optional<std::time_t> fixed_time_;
};

}  // namespace dflash
