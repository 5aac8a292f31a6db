// JSON from files we did not write (safetensors headers, config.json, index.json): parsed without
// exceptions escaping, with a nesting-depth limit so a hostile file cannot exhaust the stack.
#pragma once

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace dflash {

inline constexpr size_t kMaxJsonDepth = 64;

// `what` names the source in error messages ("safetensors header of 'x'", "config.json").
// Errors are kCorrupt with the parser's byte position.
Result<nlohmann::json> parse_untrusted_json(std::string_view text, std::string_view what,
                                            size_t max_depth = kMaxJsonDepth);

// A short, printable description of a JSON value's type for error messages ("string", "array", ...).
const char* json_type_name(const nlohmann::json& j);

}  // namespace dflash
