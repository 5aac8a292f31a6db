// libFuzzer target: parse arbitrary bytes as a Jinja template and render it against a fixed chat
// context, with tight limits. Anything may fail; nothing may crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/template.h"

namespace {

const dflash::jinja::Dict& fixed_context() {
  static const dflash::jinja::Dict context = [] {
    auto j = nlohmann::ordered_json::parse(R"({
      "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [{"type": "text", "text": "Hi \u00e9 \ud83d\ude80"}]},
        {"role": "assistant", "content": "", "reasoning_content": "think",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null]}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"}],
      "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                 "parameters": {"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]}}}],
      "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
      "enable_thinking": false})");
    dflash::jinja::Dict d;
    for (const auto& [k, v] : j.items()) d.set(std::string(k), dflash::jinja::from_json(v));
    return d;
  }();
  return context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dflash::jinja::Limits limits;
  limits.max_template_bytes = 1 << 16;
  limits.render.max_output_bytes = 1 << 20;
  limits.render.max_bytes_built = 1 << 24;
  limits.render.max_steps = 200000;
  limits.render.max_loop_iterations = 20000;
  limits.render.max_call_depth = 30;
  std::string_view source(reinterpret_cast<const char*>(data), size);
  auto tmpl = dflash::jinja::Template::parse(source, limits);
  if (!tmpl.ok()) return 0;
  dflash::jinja::RenderOptions options;
  options.now = 1736942400;
  auto out = tmpl->render(fixed_context(), options);
  volatile size_t sink = out.ok() ? out->size() : out.status().message().size();
  (void)sink;
  return 0;
}
