// Public entry point of the Jinja engine: parse template text once, render it many times.
//
// Semantics are Jinja2's as HF transformers configures it for chat templates: an immutable sandbox
// with trim_blocks and lstrip_blocks, loop controls, transformers' tojson, raise_exception and
// strftime_now. Templates are untrusted (they come from model files): every failure, including the
// limits below, comes back as a Status; nothing throws out of this API.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/value.h"

namespace dflash::jinja {

struct Limits {
  size_t max_template_bytes = size_t{4} << 20;
  int max_nesting = 400;  // parse depth of expressions and blocks
  RenderLimits render;
};

struct RenderOptions {
  // The time strftime_now() formats; the current time when unset.
  std::optional<std::time_t> now;
};

class Template {
 public:
  // Parse errors are kInvalidArgument with the line and column of the offending token.
  static Result<Template> parse(std::string_view source, const Limits& limits = {});

  // Renders with `context` as the template's variables. A raise_exception("msg") in the template
  // fails with exactly "msg" as the Status message; other errors name the template line.
  Result<std::string> render(const Dict& context, const RenderOptions& options = {}) const;
  // Convenience: the context is a JSON object (insertion-ordered, as requests are).
  Result<std::string> render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

  const Limits& limits() const { return limits_; }

 private:
  Template(std::shared_ptr<const Body> body, const Limits& limits) : body_(std::move(body)), limits_(limits) {}

  std::shared_ptr<const Body> body_;
  Limits limits_;
};

}  // namespace dflash::jinja
