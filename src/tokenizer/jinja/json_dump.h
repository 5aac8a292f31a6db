// Python's json.dumps over Jinja values, byte for byte: what transformers' `tojson` filter produces
// (json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)).
#pragma once

#include <optional>
#include <string>

#include "tokenizer/jinja/value.h"

namespace dflash::jinja {

struct JsonDumpOptions {
  bool ensure_ascii = false;
  // None: one line. A number n: newline + n spaces per level; a string: that string per level.
  std::optional<std::string> indent;
  // Python's default: (", ", ": ") without indent, (",", ": ") with one.
  std::optional<std::string> item_separator;
  std::optional<std::string> key_separator;
  bool sort_keys = false;
};

// Throws jinja::Error (TypeError) for values JSON cannot hold (undefined, namespaces, functions).
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

}  // namespace dflash::jinja
