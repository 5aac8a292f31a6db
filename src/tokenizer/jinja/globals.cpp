// Global functions of the chat-template environment: Jinja's range/dict/namespace/cycler/joiner and
// transformers' raise_exception/strftime_now.
#include <ctime>
#include <memory>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"

namespace dflash::jinja {
namespace {

Value g_range(Interpreter& in, CallArgs& a) {
  if (!a.keyword.empty()) throw_error(ErrorKind::kType, "range() takes no keyword arguments");
  const auto& p = a.positional;
  if (p.empty() || p.size() > 3) throw_error(ErrorKind::kType, "range expected 1 to 3 arguments, got {}", p.size());
  int64_t start = 0, stop, step = 1;
  if (p.size() == 1) {
    stop = to_int_arg(p[0], "range", "stop");
  } else {
    start = to_int_arg(p[0], "range", "start");
    stop = to_int_arg(p[1], "range", "stop");
    if (p.size() == 3) step = to_int_arg(p[2], "range", "step");
  }
  if (step == 0) throw_error(ErrorKind::kType, "range() arg 3 must not be zero");
  // Count in 128 bits so extreme bounds cannot overflow.
  __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  __int128 abs_step = step > 0 ? step : -static_cast<__int128>(step);
  __int128 count = span <= 0 ? 0 : (span + abs_step - 1) / abs_step;
  if (count > in.limits().max_range) {
    throw_error(ErrorKind::kSecurity,
                "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", in.limits().max_range);
  }
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(count));
  for (__int128 i = 0; i < count; ++i) out.push_back(Value::integer(static_cast<int64_t>(start + i * step)));
  return Value::list(std::move(out));
}

Dict dict_from(CallArgs& a, std::string_view fn) {
  Dict d;
  if (a.positional.size() > 1) throw_error(ErrorKind::kType, "{} expected at most 1 argument, got {}", fn, a.positional.size());
  if (!a.positional.empty()) {
    const Value& src = a.positional[0];
    if (src.is_dict() || src.is_namespace()) {
      for (const auto& [k, v] : src.as_dict().entries()) d.set(k, v);
    } else {
      for (const Value& pair : iterate(src)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) throw_error(ErrorKind::kType, "{} update sequence element has length {}; 2 is required", fn, kv.size());
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.keyword) d.set(k, v);
  return d;
}

Value g_dict(Interpreter&, CallArgs& a) { return Value::dict(dict_from(a, "dict")); }
Value g_namespace(Interpreter& in, CallArgs& a) {
  Value ns = Value::make_namespace(dict_from(a, "namespace"));
  in.track_namespace(ns);
  return ns;
}

Value g_raise_exception(Interpreter&, CallArgs& a) {
  std::string message = a.positional.empty() ? "" : to_str(a.positional[0]);
  throw Error(ErrorKind::kRaised, message);
}

Value g_strftime_now(Interpreter& in, CallArgs& a) {
  auto p = bind_args("strftime_now", a, {"format"});
  if (!p[0]) throw_error(ErrorKind::kType, "strftime_now() missing required argument 'format'");
  std::string format = to_str_arg(*p[0], "strftime_now", "format");
  if (format.empty()) return Value::string("");
  std::time_t t = in.now();
  std::tm tm{};
  localtime_r(&t, &tm);
  for (size_t cap = 256; cap <= (size_t{1} << 16); cap *= 4) {
    std::string buf(cap, '\0');
    size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
    if (n > 0) {
      buf.resize(n);
      return Value::string(std::move(buf));
    }
  }
  return Value::string("");
}

Value g_joiner(Interpreter&, CallArgs& a) {
  auto p = bind_args("joiner", a, {"sep"});
  std::string sep = p[0] ? to_str(*p[0]) : ", ";
  auto used = std::make_shared<bool>(false);
  return Value::callable("joiner", [sep, used](Interpreter&, CallArgs&) {
    if (!*used) {
      *used = true;
      return Value::string("");
    }
    return Value::string(sep);
  });
}

}  // namespace

void add_globals(Dict& globals) {
  globals.set("range", Value::callable("range", g_range));
  globals.set("dict", Value::callable("dict", g_dict));
  globals.set("namespace", Value::callable("namespace", g_namespace));
  globals.set("raise_exception", Value::callable("raise_exception", g_raise_exception));
  globals.set("strftime_now", Value::callable("strftime_now", g_strftime_now));
  globals.set("joiner", Value::callable("joiner", g_joiner));
}

}  // namespace dflash::jinja
