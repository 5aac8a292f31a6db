#include "tokenizer/jinja/json_dump.h"

#include <algorithm>
#include <cmath>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/py_string.h"

namespace dflash::jinja {
namespace {

constexpr int kMaxJsonDepth = 200;

void append_hex4(std::string& out, uint32_t u) { out += fmt::format("\\u{:04x}", u); }

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  auto escape_ascii = [&](unsigned char c) {
    switch (c) {
      case '"': out += "\\\""; return true;
      case '\\': out += "\\\\"; return true;
      case '\n': out += "\\n"; return true;
      case '\r': out += "\\r"; return true;
      case '\t': out += "\\t"; return true;
      case '\b': out += "\\b"; return true;
      case '\f': out += "\\f"; return true;
      default:
        if (c < 0x20) {
          append_hex4(out, c);
          return true;
        }
        return false;
    }
  };
  if (!ensure_ascii) {
    for (char ch : s) {
      if (!escape_ascii(static_cast<unsigned char>(ch))) out.push_back(ch);
    }
  } else {
    for (char32_t c : py::decode(s)) {
      if (c < 0x80) {
        if (escape_ascii(static_cast<unsigned char>(c))) continue;
        if (c == 0x7F) {
          append_hex4(out, c);
        } else {
          out.push_back(static_cast<char>(c));
        }
      } else if (c < 0x10000) {
        append_hex4(out, c);
      } else {
        uint32_t v = c - 0x10000;
        append_hex4(out, 0xD800 + (v >> 10));
        append_hex4(out, 0xDC00 + (v & 0x3FF));
      }
    }
  }
  out.push_back('"');
}

std::string float_json(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return format_float(f);
}

class Dumper {
 public:
  explicit Dumper(const JsonDumpOptions& o) : o_(o) {
    item_sep_ = o.item_separator ? *o.item_separator : (o.indent ? "," : ", ");
    key_sep_ = o.key_separator ? *o.key_separator : ": ";
  }

  void dump(std::string& out, const Value& v, int level) {
    if (level > kMaxJsonDepth) throw_error(ErrorKind::kLimit, "value nested too deeply for tojson");
    switch (v.kind()) {
      case Kind::kNone: out += "null"; return;
      case Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
      case Kind::kInt: out += std::to_string(v.as_int()); return;
      case Kind::kFloat: out += float_json(v.as_double()); return;
      case Kind::kString: append_json_string(out, v.as_string(), o_.ensure_ascii); return;
      case Kind::kList:
      case Kind::kTuple: dump_list(out, v.items(), level); return;
      case Kind::kDict: dump_dict(out, v.as_dict(), level); return;
      default: throw_error(ErrorKind::kType, "Object of type {} is not JSON serializable", type_name(v));
    }
  }

 private:
  void newline(std::string& out, int level) {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *o_.indent;
  }

  void dump_list(std::string& out, const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out.push_back('[');
    if (o_.indent) newline(out, level + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) {
        out += item_sep_;
        if (o_.indent) newline(out, level + 1);
      }
      dump(out, items[i], level + 1);
    }
    if (o_.indent) newline(out, level);
    out.push_back(']');
  }

  std::string key_text(const Value& k) {
    switch (k.kind()) {
      case Kind::kString: return k.as_string();
      case Kind::kNone: return "null";
      case Kind::kBool: return k.as_bool() ? "true" : "false";
      case Kind::kInt: return std::to_string(k.as_int());
      case Kind::kFloat: return float_json(k.as_double());
      default:
        throw_error(ErrorKind::kType, "keys must be str, int, float, bool or None, not {}", type_name(k));
    }
  }

  void dump_dict(std::string& out, const Dict& d, int level) {
    if (d.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> entries;
    entries.reserve(d.size());
    for (const auto& e : d.entries()) entries.push_back(&e);
    if (o_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto* a, const auto* b) { return compare(a->first, b->first, "<") < 0; });
    }
    out.push_back('{');
    if (o_.indent) newline(out, level + 1);
    bool first = true;
    for (const auto* e : entries) {
      if (!first) {
        out += item_sep_;
        if (o_.indent) newline(out, level + 1);
      }
      first = false;
      append_json_string(out, key_text(e->first), o_.ensure_ascii);
      out += key_sep_;
      dump(out, e->second, level + 1);
    }
    if (o_.indent) newline(out, level);
    out.push_back('}');
  }

  const JsonDumpOptions& o_;
  std::string item_sep_;
  std::string key_sep_;
};

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  Dumper(options).dump(out, v, 0);
  return out;
}

}  // namespace dflash::jinja
