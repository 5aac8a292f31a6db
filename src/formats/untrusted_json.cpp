#include "formats/untrusted_json.h"

#include <exception>

namespace dflash {
namespace {

// Deepest bracket nesting of `text` outside string literals; stops counting past `limit`.
size_t max_nesting(std::string_view text, size_t limit) {
  size_t depth = 0;
  size_t deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // skip the escaped character (a '"' after '\' does not end the string)
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
      if (depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

Result<nlohmann::json> parse_untrusted_json(std::string_view text, std::string_view what, size_t max_depth) {
  if (max_nesting(text, max_depth) > max_depth)
    return corrupt("{}: JSON nests deeper than {} levels", what, max_depth);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return corrupt("{}: invalid JSON at byte {}: {}", what, e.byte, e.what());
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, fmt::format("{}: out of memory parsing JSON", what));
  } catch (const std::exception& e) {
    return corrupt("{}: invalid JSON: {}", what, e.what());
  }
}

const char* json_type_name(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "object";
    case nlohmann::json::value_t::array: return "array";
    case nlohmann::json::value_t::string: return "string";
    case nlohmann::json::value_t::boolean: return "boolean";
    case nlohmann::json::value_t::number_integer: return "integer";
    case nlohmann::json::value_t::number_unsigned: return "integer";
    case nlohmann::json::value_t::number_float: return "number";
    case nlohmann::json::value_t::binary: return "binary";
    case nlohmann::json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

}  // namespace dflash
