// Python-style argument binding and conversions shared by the builtin filters, tests, globals and methods.
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"

namespace dflash::jinja {

std::vector<std::optional<Value>> bind_args(std::string_view fn, CallArgs& args,
                                            std::initializer_list<std::string_view> names) {
  std::vector<std::optional<Value>> out(names.size());
  if (args.positional.size() > names.size()) {
    throw_error(ErrorKind::kType, "{}() takes at most {} argument(s) ({} given)", fn, names.size(),
                args.positional.size());
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    bool found = false;
    for (std::string_view n : names) {
      if (n == key) {
        found = true;
        break;
      }
      ++i;
    }
    if (!found) throw_error(ErrorKind::kType, "{}() got an unexpected keyword argument '{}'", fn, key);
    if (out[i]) throw_error(ErrorKind::kType, "{}() got multiple values for argument '{}'", fn, key);
    out[i] = value;
  }
  return out;
}

int64_t to_int_arg(const Value& v, std::string_view fn, std::string_view param) {
  if (v.is_integral()) return v.as_int();
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_message());
  throw_error(ErrorKind::kType, "{}(): '{}' must be an integer, not '{}'", fn, param, type_name(v));
}

std::string to_str_arg(const Value& v, std::string_view fn, std::string_view param) {
  if (v.is_string()) return v.as_string();
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_message());
  throw_error(ErrorKind::kType, "{}(): '{}' must be a string, not '{}'", fn, param, type_name(v));
}

}  // namespace dflash::jinja
