// Helpers for the Jinja engine tests: render a template string with a JSON context, or get its error.
#pragma once

#include <string>
#include <string_view>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/jinja/template.h"

namespace dflash::jinja::testing {

inline constexpr std::time_t kFixedNow = 1736942400;  // 2025-01-15 12:00:00 UTC

inline nlohmann::ordered_json ctx(std::string_view json) { return nlohmann::ordered_json::parse(json); }

// The rendered text; a failed parse or render fails the test and returns a marker.
inline std::string render(std::string_view tmpl, const nlohmann::ordered_json& context = nlohmann::ordered_json::object(),
                          const Limits& limits = {}) {
  Result<Template> t = Template::parse(tmpl, limits);
  if (!t.ok()) {
    ADD_FAILURE() << "parse failed: " << t.status().to_string() << "\n  template: " << tmpl;
    return "<parse error>";
  }
  RenderOptions options;
  options.now = kFixedNow;
  Result<std::string> r = t->render(context, options);
  if (!r.ok()) {
    ADD_FAILURE() << "render failed: " << r.status().to_string() << "\n  template: " << tmpl;
    return "<render error>";
  }
  return *r;
}

// The Status message of a failed parse or render; "" (and a test failure) when it succeeded.
inline std::string error_of(std::string_view tmpl, const nlohmann::ordered_json& context = nlohmann::ordered_json::object(),
                            const Limits& limits = {}) {
  Result<Template> t = Template::parse(tmpl, limits);
  if (!t.ok()) return t.status().message();
  RenderOptions options;
  options.now = kFixedNow;
  Result<std::string> r = t->render(context, options);
  if (r.ok()) {
    ADD_FAILURE() << "expected an error, got: " << *r << "\n  template: " << tmpl;
    return "";
  }
  return r.status().message();
}

}  // namespace dflash::jinja::testing
