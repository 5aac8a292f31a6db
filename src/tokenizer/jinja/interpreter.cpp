#include "tokenizer/jinja/interpreter.h"

#include <cmath>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/py_string.h"

namespace dflash::jinja {
namespace {

uintptr_t stack_address() {
  volatile char marker = 0;
  return reinterpret_cast<uintptr_t>(&marker);
}

std::string missing_attribute(const Value& object, const std::string& name) {
  if (object.is_none()) return fmt::format("'None' has no attribute '{}'", name);
  return fmt::format("'{} object' has no attribute '{}'", type_name(object), name);
}

std::optional<int64_t> slice_bound(const Value& v, bool& ok) {
  if (v.is_none()) return std::nullopt;
  if (v.is_integral()) return v.as_int();
  ok = false;
  return std::nullopt;
}

}  // namespace

// ---- Frame ----

const Value* Frame::find_local(const std::string& name) const {
  for (const auto& [k, v] : vars) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Frame::set(const std::string& name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(name, std::move(value));
}

// ---- Interpreter: setup and limits ----

Interpreter::Interpreter(const Dict& context, const RenderLimits& limits, std::function<std::time_t()> now)
    : context_(context), limits_(limits), now_(std::move(now)) {
  add_globals(globals_);
}

Interpreter::~Interpreter() {
  for (Value& ns : namespaces_) ns.mutable_namespace() = Dict();
}

std::string Interpreter::render(const Body& body) {
  stack_base_ = stack_address();
  root_ = std::make_shared<Frame>();
  std::string out;
  out_ = &out;
  exec_body(body, root_);
  out_ = nullptr;
  return out;
}

void Interpreter::step() {
  if (++steps_ > limits_.max_steps) {
    throw_error(ErrorKind::kLimit, "template evaluation exceeded {} steps", limits_.max_steps);
  }
  uintptr_t here = stack_address();
  uintptr_t used = here > stack_base_ ? here - stack_base_ : stack_base_ - here;
  if (used > limits_.max_stack_bytes) throw_error(ErrorKind::kLimit, "template recursion is too deep");
}

void Interpreter::charge_bytes(size_t n) {
  if (n > limits_.max_output_bytes) {
    throw_error(ErrorKind::kLimit, "a string of {} bytes exceeds the output limit of {} bytes", n,
                limits_.max_output_bytes);
  }
  bytes_built_ += n;
  if (bytes_built_ > limits_.max_bytes_built) {
    throw_error(ErrorKind::kLimit, "template built more than {} bytes of text", limits_.max_bytes_built);
  }
}

void Interpreter::check_items(size_t n) {
  if (n > limits_.max_collection_items) throw_error(ErrorKind::kLimit, "a list of {} items is too large", n);
}

void Interpreter::write(std::string_view s) {
  if (out_->size() + s.size() > limits_.max_output_bytes) {
    throw_error(ErrorKind::kLimit, "rendered text exceeds the output limit of {} bytes", limits_.max_output_bytes);
  }
  bytes_built_ += s.size();
  if (bytes_built_ > limits_.max_bytes_built) {
    throw_error(ErrorKind::kLimit, "template built more than {} bytes of text", limits_.max_bytes_built);
  }
  out_->append(s);
}

void Interpreter::write_value(const Value& v) {
  if (v.is_string()) {
    write(v.as_string());
  } else {
    write(to_str(v));
  }
}

std::string Interpreter::capture(const Body& body, const std::shared_ptr<Frame>& frame) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  try {
    exec_body(body, frame);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

// ---- statements ----

Interpreter::Flow Interpreter::exec_body(const Body& body, const std::shared_ptr<Frame>& frame) {
  for (const StmtPtr& s : body) {
    Flow f = exec(*s, frame);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  step();
  try {
    switch (s.kind) {
      case StmtKind::kText: write(s.text); return Flow::kNormal;
      case StmtKind::kPrint: write_value(eval(*s.expr, frame)); return Flow::kNormal;
      case StmtKind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (truthy(eval(*s.conditions[i], frame))) return exec_body(s.bodies[i], frame);
        }
        return exec_body(s.else_body, frame);
      case StmtKind::kFor: return exec_for(s, frame);
      case StmtKind::kSet:
      case StmtKind::kSetBlock: exec_set(s, frame); return Flow::kNormal;
      case StmtKind::kMacro: frame->set(s.text, define_macro(s, frame)); return Flow::kNormal;
      case StmtKind::kCallBlock: exec_call_block(s, frame); return Flow::kNormal;
      case StmtKind::kFilterBlock: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        Value text = Value::string(capture(s.body, inner));
        write_value(eval_filter_chain(*s.expr, frame, &text));
        return Flow::kNormal;
      }
      case StmtKind::kWith: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        std::vector<Value> values;
        for (const auto& v : s.with_values) values.push_back(eval(*v, frame));
        for (size_t i = 0; i < s.with_targets.size(); ++i) assign(s.with_targets[i], values[i], inner);
        return exec_body(s.body, inner);
      }
      case StmtKind::kScope: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        exec_body(s.body, inner);
        return Flow::kNormal;
      }
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
    }
  } catch (Error& e) {
    e.set_position(s.line, s.column);
    throw;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  Value iterable = eval(*s.expr, frame);
  std::vector<Value> items = iterate(iterable);
  if (s.condition) {
    std::vector<Value> kept;
    for (Value& item : items) {
      if (++iterations_ > limits_.max_loop_iterations) {
        throw_error(ErrorKind::kLimit, "template loops exceeded {} iterations", limits_.max_loop_iterations);
      }
      auto probe = std::make_shared<Frame>();
      probe->parent = frame;
      assign(s.target, item, probe);
      if (truthy(eval(*s.condition, probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    exec_body(s.else_body, inner);
    return Flow::kNormal;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    if (++iterations_ > limits_.max_loop_iterations) {
      throw_error(ErrorKind::kLimit, "template loops exceeded {} iterations", limits_.max_loop_iterations);
    }
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    Dict loop;
    loop.set("index", Value::integer(i + 1));
    loop.set("index0", Value::integer(i));
    loop.set("revindex", Value::integer(n - i));
    loop.set("revindex0", Value::integer(n - i - 1));
    loop.set("first", Value::boolean(i == 0));
    loop.set("last", Value::boolean(i == n - 1));
    loop.set("length", Value::integer(n));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    if (i > 0) loop.set("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop.set("nextitem", items[static_cast<size_t>(i + 1)]);
    loop.set("cycle", Value::callable("loop.cycle", [i](Interpreter&, CallArgs& args) {
               if (args.positional.empty()) throw_error(ErrorKind::kType, "no items for cycling given");
               return args.positional[static_cast<size_t>(i) % args.positional.size()];
             }));
    inner->set("loop", Value::dict(std::move(loop)));
    assign(s.target, items[static_cast<size_t>(i)], inner);
    if (exec_body(s.body, inner) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Interpreter::exec_set(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  Value v;
  if (s.kind == StmtKind::kSet) {
    v = eval(*s.expr, frame);
  } else {
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    v = Value::string(capture(s.body, inner));
    if (s.expr) v = eval_filter_chain(*s.expr, frame, &v);
  }
  assign(s.target, std::move(v), frame);
}

void Interpreter::assign(const Target& t, Value v, const std::shared_ptr<Frame>& frame) {
  switch (t.kind) {
    case Target::Kind::kName: frame->set(t.name, std::move(v)); return;
    case Target::Kind::kNamespaceAttr: {
      Value ns = lookup(t.name, frame);
      if (!ns.is_namespace()) throw_error(ErrorKind::kType, "cannot assign attribute on non-namespace object");
      ns.mutable_namespace().set(t.attr, std::move(v));
      return;
    }
    case Target::Kind::kTuple: {
      std::vector<Value> items = iterate(v);
      if (items.size() < t.elements.size()) {
        throw_error(ErrorKind::kType, "not enough values to unpack (expected {}, got {})", t.elements.size(),
                    items.size());
      }
      if (items.size() > t.elements.size()) {
        throw_error(ErrorKind::kType, "too many values to unpack (expected {})", t.elements.size());
      }
      for (size_t i = 0; i < items.size(); ++i) assign(t.elements[i], std::move(items[i]), frame);
      return;
    }
  }
}

Value Interpreter::define_macro(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  std::weak_ptr<Frame> defining = frame;
  const Stmt* node = &s;
  return Value::callable(s.text, [node, defining](Interpreter& in, CallArgs& args) {
    std::shared_ptr<Frame> parent = defining.lock();
    return in.call_macro(*node, parent ? parent : in.root_, args, false);
  });
}

Value Interpreter::call_macro(const Stmt& s, const std::shared_ptr<Frame>& defining, CallArgs& args,
                              bool is_caller) {
  if (call_depth_ >= limits_.max_call_depth) {
    throw_error(ErrorKind::kLimit, "macro calls nested deeper than {}", limits_.max_call_depth);
  }
  auto frame = std::make_shared<Frame>();
  frame->parent = defining;
  std::vector<Value> varargs;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < s.params.size()) {
      frame->set(s.params[i].name, args.positional[i]);
    } else {
      varargs.push_back(args.positional[i]);
    }
  }
  Dict kwargs;
  for (auto& [name, value] : args.keyword) {
    bool is_param = false;
    for (size_t i = 0; i < s.params.size(); ++i) {
      if (s.params[i].name != name) continue;
      if (i < args.positional.size()) {
        throw_error(ErrorKind::kType, "macro '{}' got multiple values for argument '{}'", s.text, name);
      }
      is_param = true;
    }
    if (is_param || (name == "caller" && !is_caller)) {
      frame->set(name, value);
    } else {
      kwargs.set(name, value);
    }
  }
  for (const MacroParam& p : s.params) {
    if (frame->find_local(p.name)) continue;
    frame->set(p.name, p.default_value ? eval(*p.default_value, frame)
                                       : Value::undefined(fmt::format("'{}' is undefined", p.name)));
  }
  frame->set("varargs", Value::tuple(std::move(varargs)));
  frame->set("kwargs", Value::dict(std::move(kwargs)));
  ++call_depth_;
  std::string text;
  try {
    text = capture(s.body, frame);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return Value::string(std::move(text));
}

void Interpreter::exec_call_block(const Stmt& s, const std::shared_ptr<Frame>& frame) {
  const Expr& call = *s.expr;
  Value callee = eval(*call.object, frame);
  CallArgs args = eval_args(call, frame);
  std::weak_ptr<Frame> site = frame;
  const Stmt* node = &s;
  args.keyword.emplace_back("caller", Value::callable("caller", [node, site](Interpreter& in, CallArgs& a) {
                              std::shared_ptr<Frame> parent = site.lock();
                              return in.call_macro(*node, parent ? parent : in.root_, a, true);
                            }));
  write_value(this->call(callee, args));
}

// ---- expressions ----

Value Interpreter::lookup(const std::string& name, const std::shared_ptr<Frame>& frame) const {
  for (const Frame* f = frame.get(); f; f = f->parent.get()) {
    if (const Value* v = f->find_local(name)) return *v;
  }
  if (const Value* v = context_.find(name)) return *v;
  if (const Value* v = globals_.find(name)) return *v;
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
  step();
  try {
    return eval_inner(e, frame);
  } catch (Error& err) {
    err.set_position(e.line, e.column);
    throw;
  }
}

CallArgs Interpreter::eval_args(const Expr& e, const std::shared_ptr<Frame>& frame) {
  CallArgs args;
  for (const auto& a : e.items) args.positional.push_back(eval(*a, frame));
  if (e.dyn_args) {
    for (Value& v : iterate(eval(*e.dyn_args, frame))) args.positional.push_back(std::move(v));
  }
  for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, frame));
  if (e.dyn_kwargs) {
    Value d = eval(*e.dyn_kwargs, frame);
    if (!d.is_dict()) throw_error(ErrorKind::kType, "argument after ** must be a mapping, not {}", type_name(d));
    for (const auto& [k, v] : d.as_dict().entries()) {
      if (!k.is_string()) throw_error(ErrorKind::kType, "keywords must be strings");
      args.keyword.emplace_back(k.as_string(), v);
    }
  }
  return args;
}

Value Interpreter::eval_filter_chain(const Expr& e, const std::shared_ptr<Frame>& frame, const Value* block_input) {
  step();
  Value input = e.object ? (e.object->kind == ExprKind::kFilter ? eval_filter_chain(*e.object, frame, block_input)
                                                               : eval(*e.object, frame))
                         : *block_input;
  CallArgs args = eval_args(e, frame);
  try {
    return apply_filter(e.name, input, args);
  } catch (Error& err) {
    err.set_position(e.line, e.column);
    throw;
  }
}

Value Interpreter::eval_inner(const Expr& e, const std::shared_ptr<Frame>& frame) {
  switch (e.kind) {
    case ExprKind::kConst: return e.value;
    case ExprKind::kName: return lookup(e.name, frame);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& i : e.items) items.push_back(eval(*i, frame));
      return e.kind == ExprKind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t i = 0; i < e.items.size(); ++i) {
        Value k = eval(*e.items[i], frame);
        if (k.is_list() || k.is_dict() || k.is_namespace() || k.is_undefined()) {
          throw_error(ErrorKind::kType, "unhashable type: '{}'", type_name(k));
        }
        d.set(std::move(k), eval(*e.values[i], frame));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kGetAttr: return get_attr(eval(*e.object, frame), e.name);
    case ExprKind::kGetItem: {
      Value object = eval(*e.object, frame);
      if (e.arg->kind == ExprKind::kSlice) return eval_slice(object, *e.arg, frame);
      return get_item(object, eval(*e.arg, frame));
    }
    case ExprKind::kSlice: throw_error(ErrorKind::kSyntax, "a slice is only valid inside []");
    case ExprKind::kCall: {
      Value callee = eval(*e.object, frame);
      CallArgs args = eval_args(e, frame);
      return call(callee, args);
    }
    case ExprKind::kFilter: return eval_filter_chain(e, frame, nullptr);
    case ExprKind::kTest: {
      Value subject = eval(*e.object, frame);
      CallArgs args = eval_args(e, frame);
      bool r = apply_test(e.name, subject, args);
      return Value::boolean(e.negated ? !r : r);
    }
    case ExprKind::kUnary: {
      Value v = eval(*e.object, frame);
      if (e.name == "not") return Value::boolean(!truthy(v));
      return e.name == "-" ? unary_minus(v) : unary_plus(v);
    }
    case ExprKind::kBinary: return eval_binary(e, frame);
    case ExprKind::kCompare: return eval_compare(e, frame);
    case ExprKind::kCondition:
      if (truthy(eval(*e.arg, frame))) return eval(*e.object, frame);
      if (e.third) return eval(*e.third, frame);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
  }
  throw_error(ErrorKind::kSyntax, "unknown expression");
}

Value Interpreter::eval_binary(const Expr& e, const std::shared_ptr<Frame>& frame) {
  if (e.name == "and") {
    Value left = eval(*e.object, frame);
    return truthy(left) ? eval(*e.arg, frame) : left;
  }
  if (e.name == "or") {
    Value left = eval(*e.object, frame);
    return truthy(left) ? left : eval(*e.arg, frame);
  }
  Value left = eval(*e.object, frame);
  Value right = eval(*e.arg, frame);
  return binary_op(*this, e.name, left, right);
}

Value Interpreter::eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame) {
  Value left = eval(*e.object, frame);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i], frame);
    const std::string& op = e.ops[i];
    bool r;
    if (op == "==") r = equals(left, right);
    else if (op == "!=") r = !equals(left, right);
    else if (op == "in") r = contains(right, left);
    else if (op == "notin") r = !contains(right, left);
    else {
      int c = compare(left, right, op);
      bool nan = (left.is_float() && std::isnan(left.as_double())) || (right.is_float() && std::isnan(right.as_double()));
      if (nan) r = false;
      else if (op == "<") r = c < 0;
      else if (op == "<=") r = c <= 0;
      else if (op == ">") r = c > 0;
      else r = c >= 0;
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interpreter::eval_slice(const Value& object, const Expr& slice, const std::shared_ptr<Frame>& frame) {
  Value a = slice.object ? eval(*slice.object, frame) : Value::none();
  Value b = slice.arg ? eval(*slice.arg, frame) : Value::none();
  Value c = slice.third ? eval(*slice.third, frame) : Value::none();
  // Jinja compiles x[a:b] to a plain Python subscript: no undefined fallback as for x[key].
  if (object.is_undefined()) throw Error(ErrorKind::kUndefined, object.undefined_message());
  if (object.is_dict()) throw_error(ErrorKind::kType, "unhashable type: 'slice'");
  if (!(object.is_string() || object.is_list_or_tuple())) {
    throw_error(ErrorKind::kType, "'{}' object is not subscriptable", type_name(object));
  }
  bool ok = true;
  auto start = slice_bound(a, ok), stop = slice_bound(b, ok), step_v = slice_bound(c, ok);
  if (!ok) throw_error(ErrorKind::kType, "slice indices must be integers or None or have an __index__ method");
  if (object.is_string()) {
    if (step_v && *step_v == 0) throw_error(ErrorKind::kType, "slice step cannot be zero");
    return Value::string(py::slice(object.as_string(), start, stop, step_v));
  }
  const auto& items = object.items();
  py::SliceBounds sb = py::slice_indices(static_cast<int64_t>(items.size()), start, stop, step_v);
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(sb.count));
  for (int64_t k = 0, i = sb.start; k < sb.count; ++k, i += sb.step) out.push_back(items[static_cast<size_t>(i)]);
  return object.is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
}

// ---- attribute, item, call ----

Value Interpreter::get_attr(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Kind::kUndefined: throw Error(ErrorKind::kUndefined, object.undefined_message());
    case Kind::kDict: {
      if (auto m = bind_method(object, name)) return *m;
      if (const Value* v = object.as_dict().find(std::string_view(name))) return *v;
      return Value::undefined(missing_attribute(object, name));
    }
    case Kind::kNamespace:
      if (const Value* v = object.as_dict().find(std::string_view(name))) return *v;
      return Value::undefined(missing_attribute(object, name));
    case Kind::kString:
    case Kind::kList:
    case Kind::kTuple:
      if (auto m = bind_method(object, name)) return *m;
      return Value::undefined(missing_attribute(object, name));
    default: return Value::undefined(missing_attribute(object, name));
  }
}

Value Interpreter::get_item(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Kind::kUndefined: throw Error(ErrorKind::kUndefined, object.undefined_message());
    case Kind::kDict:
      if (const Value* v = object.as_dict().find(key)) return *v;
      break;
    case Kind::kNamespace:
      if (key.is_string()) return get_attr(object, key.as_string());
      break;
    case Kind::kString:
      if (key.is_integral()) {
        if (auto c = py::char_at(object.as_string(), key.as_int())) return Value::string(std::move(*c));
        return Value::undefined("string index out of range");
      }
      break;
    case Kind::kList:
    case Kind::kTuple:
      if (key.is_integral()) {
        int64_t n = static_cast<int64_t>(object.items().size());
        int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
        if (i >= 0 && i < n) return object.items()[static_cast<size_t>(i)];
        return Value::undefined(fmt::format("{} index out of range", type_name(object)));
      }
      break;
    default: break;
  }
  if (key.is_string()) {
    if (object.is_dict() || object.is_string() || object.is_list_or_tuple()) {
      if (auto m = bind_method(object, key.as_string())) return *m;
    }
    return Value::undefined(missing_attribute(object, key.as_string()));
  }
  return Value::undefined(fmt::format("'{} object' has no element {}", type_name(object), repr(key)));
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_callable()) return callee.as_callable().fn(*this, args);
  if (callee.is_undefined()) throw Error(ErrorKind::kUndefined, callee.undefined_message());
  throw_error(ErrorKind::kType, "'{}' object is not callable", type_name(callee));
}

Value Interpreter::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  const FilterFn* f = find_filter(name);
  if (!f) throw_error(ErrorKind::kSyntax, "No filter named '{}'.", name);
  return (*f)(*this, input, args);
}

bool Interpreter::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  const TestFn* t = find_test(name);
  if (!t) throw_error(ErrorKind::kSyntax, "No test named '{}'.", name);
  return (*t)(*this, input, args);
}

}  // namespace dflash::jinja
