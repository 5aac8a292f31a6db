// Renders a parsed template: scopes, statements, expression evaluation, macros and the limits that keep
// hostile templates from running away (steps, loop iterations, output size, call depth, stack use).
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace dflash::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{32} << 20;     // the rendered text and any single string built on the way
  uint64_t max_bytes_built = uint64_t{1} << 30;   // all string bytes produced during one render
  uint64_t max_steps = 50'000'000;                // statements and expression nodes evaluated
  uint64_t max_loop_iterations = 10'000'000;      // for-loop iterations, all loops together
  int max_call_depth = 100;                       // nested macro calls
  size_t max_stack_bytes = size_t{2} << 20;       // native stack the evaluator may use
  size_t max_collection_items = size_t{1} << 22;  // items of a list built by repetition, range(), ...
  int64_t max_range = 100000;                     // what jinja2's sandbox allows for range()
};

// One variable scope. Loops, macros, set/filter blocks and `with` open a child scope; `if` does not.
struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find_local(const std::string& name) const;
  void set(const std::string& name, Value value);
};

class Interpreter {
 public:
  // `context` holds the render variables (messages, tools, bos_token, ...); `now` returns the time
  // strftime_now() formats.
  Interpreter(const Dict& context, const RenderLimits& limits, std::function<std::time_t()> now);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `body` (the template root). Throws jinja::Error.
  std::string render(const Body& body);

  // For builtins.
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);
  Value get_attr(const Value& object, const std::string& name);
  Value get_item(const Value& object, const Value& key);
  // Accounts for a string of `n` bytes about to be built; throws when a limit would be passed.
  void charge_bytes(size_t n);
  void check_items(size_t n);
  const RenderLimits& limits() const { return limits_; }
  std::time_t now() const { return now_(); }
  // Namespaces are the only mutable values, so only they can form reference cycles ({% set ns.x = ns %});
  // the interpreter keeps each one and empties it when the render ends.
  void track_namespace(const Value& ns) { namespaces_.push_back(ns); }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_body(const Body& body, const std::shared_ptr<Frame>& frame);
  Flow exec(const Stmt& s, const std::shared_ptr<Frame>& frame);
  Flow exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame);
  void exec_set(const Stmt& s, const std::shared_ptr<Frame>& frame);
  void exec_call_block(const Stmt& s, const std::shared_ptr<Frame>& frame);
  Value define_macro(const Stmt& s, const std::shared_ptr<Frame>& frame);
  Value call_macro(const Stmt& s, const std::shared_ptr<Frame>& defining, CallArgs& args, bool is_caller);
  std::string capture(const Body& body, const std::shared_ptr<Frame>& frame);

  Value eval(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_inner(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_filter_chain(const Expr& e, const std::shared_ptr<Frame>& frame, const Value* block_input);
  CallArgs eval_args(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_binary(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_compare(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_slice(const Value& object, const Expr& slice, const std::shared_ptr<Frame>& frame);
  Value lookup(const std::string& name, const std::shared_ptr<Frame>& frame) const;
  void assign(const Target& t, Value v, const std::shared_ptr<Frame>& frame);

  void step();
  void write(std::string_view s);
  void write_value(const Value& v);

  const Dict& context_;
  Dict globals_;
  RenderLimits limits_;
  std::function<std::time_t()> now_;
  std::shared_ptr<Frame> root_;
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  uint64_t iterations_ = 0;
  uint64_t bytes_built_ = 0;
  int call_depth_ = 0;
  uintptr_t stack_base_ = 0;
  std::vector<Value> namespaces_;
};

}  // namespace dflash::jinja
