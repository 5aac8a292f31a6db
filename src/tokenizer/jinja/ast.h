// The syntax tree of a parsed template: expression nodes and statement nodes, each with its line.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace dflash::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  kConst,     // value
  kName,      // name
  kList,      // items
  kTuple,     // items
  kDict,      // keys[i]: values[i]
  kGetAttr,   // object.name
  kGetItem,   // object[arg]  (arg may be a kSlice)
  kSlice,     // start:stop:step, each optional (null)
  kCall,      // object(args, kwargs)
  kFilter,    // object|name(args, kwargs); object is null inside {% filter %} blocks
  kTest,      // object is [not] name(args)
  kUnary,     // op object   ("not", "-", "+")
  kBinary,    // left op right ("+", "-", "*", "/", "//", "%", "**", "and", "or", "~")
  kCompare,   // object (ops[i] operands[i])...  chained like Python
  kCondition, // then if test else otherwise (otherwise may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;
  Value value;                // kConst
  std::string name;           // kName, kGetAttr, kFilter, kTest; operator of kUnary/kBinary
  ExprPtr object;             // operand / callee / left / test subject
  ExprPtr arg;                // right operand, subscript, condition test
  ExprPtr third;              // condition's else branch; slice step
  std::vector<ExprPtr> items; // list/tuple items, call/filter/test positional args, dict keys, compare operands
  std::vector<ExprPtr> values;                             // dict values
  std::vector<std::pair<std::string, ExprPtr>> kwargs;     // call/filter/test keyword args
  std::vector<std::string> ops;                            // compare operators ("==", "in", "notin", ...)
  ExprPtr dyn_args;           // f(*args)
  ExprPtr dyn_kwargs;         // f(**kwargs)
  bool negated = false;       // kTest: "is not"

  Expr(ExprKind k, int l, int c) : kind(k), line(l), column(c) {}
};

// Assignment targets of for / set / with: a name, a tuple of targets, or namespace.attr.
struct Target {
  enum class Kind { kName, kTuple, kNamespaceAttr } kind = Kind::kName;
  std::string name;              // kName; the namespace variable of kNamespaceAttr
  std::string attr;              // kNamespaceAttr
  std::vector<Target> elements;  // kTuple
};

enum class StmtKind {
  kText,        // text
  kPrint,       // {{ expr }}
  kIf,          // conditions[i] -> bodies[i], else_body
  kFor,         // for target in expr [if cond] body [else else_body]
  kSet,         // set target = expr
  kSetBlock,    // set target [| filters] body endset
  kMacro,       // macro name(params=defaults) body
  kCallBlock,   // call[(params)] expr body endcall
  kFilterBlock, // filter expr body endfilter (expr is a filter chain applied to the body's output)
  kWith,        // with targets = exprs body endwith
  kScope,       // a body rendered in its own scope ({% generation %} blocks)
  kBreak,
  kContinue,
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required (undefined when not given)
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  int column = 0;
  std::string text;                 // kText; macro name
  ExprPtr expr;                     // print, set, for iterable, call-block call, filter-block chain
  ExprPtr condition;                // for ... if condition
  Target target;                    // for, set, set block
  std::vector<ExprPtr> conditions;  // if / elif
  std::vector<Body> bodies;         // if / elif bodies
  Body body;
  Body else_body;
  std::vector<MacroParam> params;   // macro / call-block params
  std::vector<Target> with_targets; // with
  std::vector<ExprPtr> with_values;

  Stmt(StmtKind k, int l, int c) : kind(k), line(l), column(c) {}
};

}  // namespace dflash::jinja
