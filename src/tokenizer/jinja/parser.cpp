#include "tokenizer/jinja/parser.h"

#include <initializer_list>
#include <string_view>

#include "tokenizer/jinja/error.h"

namespace dflash::jinja {
namespace {

std::string describe(const Token& t) {
  switch (t.type) {
    case TokenType::kData: return "template data";
    case TokenType::kVarBegin: return "begin of print statement";
    case TokenType::kVarEnd: return "end of print statement";
    case TokenType::kBlockBegin: return "begin of statement block";
    case TokenType::kBlockEnd: return "end of statement block";
    case TokenType::kName:
    case TokenType::kOperator:
    case TokenType::kInteger:
    case TokenType::kFloat: return t.text;
    case TokenType::kString: return "string";
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const ParserLimits& limits) : toks_(tokens), limits_(limits) {}

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != TokenType::kEof) fail(cur(), "unexpected " + describe(cur()));
    return body;
  }

 private:
  // ---- token stream ----
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool is_op(std::string_view op) const { return cur().type == TokenType::kOperator && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().type == TokenType::kName && cur().text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail(cur(), fmt::format("expected '{}', got '{}'", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail(cur(), fmt::format("expected name, got '{}'", describe(cur())));
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) {
      fail(cur(), fmt::format("expected end of statement block, got '{}'", describe(cur())));
    }
    advance();
  }

  [[noreturn]] void fail(const Token& at, const std::string& message) {
    throw Error(ErrorKind::kSyntax, message, at.line, at.column);
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_depth) p.fail(p.cur(), "template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // Operator and postfix loops build left-nested trees; each wrap counts as one level of nesting.
  struct ChainDepth {
    Parser& p;
    int added = 0;
    explicit ChainDepth(Parser& parser) : p(parser) {}
    void wrap() {
      ++added;
      if (++p.depth_ > p.limits_.max_depth) p.fail(p.cur(), "template nested too deeply");
    }
    ~ChainDepth() { p.depth_ -= added; }
  };

  ExprPtr make(ExprKind k, const Token& at) { return std::make_unique<Expr>(k, at.line, at.column); }

  // ---- statements ----

  // Parses template data, prints and statements until a block tag whose name is one of `end_names`
  // (left as the current token, after its {%) or the end of input.
  Body subparse(std::initializer_list<std::string_view> end_names) {
    DepthGuard guard(*this);
    Body body;
    while (cur().type != TokenType::kEof) {
      const Token& t = cur();
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>(StmtKind::kText, t.line, t.column);
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == TokenType::kVarBegin) {
        advance();
        auto s = std::make_unique<Stmt>(StmtKind::kPrint, t.line, t.column);
        s->expr = parse_tuple(true, {});
        if (cur().type != TokenType::kVarEnd) {
          fail(cur(), fmt::format("expected end of print statement, got '{}'", describe(cur())));
        }
        advance();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        advance();
        if (cur().type == TokenType::kName) {
          for (std::string_view e : end_names) {
            if (cur().text == e) return body;
          }
        }
        body.push_back(parse_statement());
        expect_block_end();
      } else {
        fail(t, "unexpected " + describe(t));
      }
    }
    if (end_names.size() != 0) {
      std::string wanted;
      for (std::string_view e : end_names) wanted += (wanted.empty() ? "'" : " or '") + std::string(e) + "'";
      fail(cur(), "unexpected end of template; looking for the tag " + wanted);
    }
    return body;
  }

  // Body of a block statement: expects the %} of the opening tag, then statements up to an end tag.
  Body parse_body(std::initializer_list<std::string_view> end_names) {
    skip_op(":");
    expect_block_end();
    return subparse(end_names);
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    if (t.type != TokenType::kName) fail(t, "tag name expected");
    const std::string name = t.text;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "call") return parse_call_block();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "print") {
      auto s = std::make_unique<Stmt>(StmtKind::kPrint, t.line, t.column);
      advance();
      s->expr = parse_tuple(true, {});
      return s;
    }
    if (name == "generation") {  // transformers' AssistantTracker extension: renders its body
      auto s = std::make_unique<Stmt>(StmtKind::kScope, t.line, t.column);
      advance();
      s->body = parse_body({"endgeneration"});
      advance();
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail(t, fmt::format("'{}' outside loop", name));
      advance();
      return std::make_unique<Stmt>(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, t.line, t.column);
    }
    if (name == "block" || name == "extends" || name == "include" || name == "import" || name == "from" ||
        name == "autoescape") {
      fail(t, fmt::format("the '{}' tag is not supported in chat templates", name));
    }
    fail(t, fmt::format("Encountered unknown tag '{}'.", name));
  }

  StmtPtr parse_if() {
    const Token& t = cur();
    auto s = std::make_unique<Stmt>(StmtKind::kIf, t.line, t.column);
    advance();
    while (true) {
      s->conditions.push_back(parse_tuple(false, {}));
      s->bodies.push_back(parse_body({"elif", "else", "endif"}));
      std::string tag = cur().text;
      advance();
      if (tag == "elif") continue;
      if (tag == "else") {
        s->else_body = parse_body({"endif"});
        advance();
      }
      break;
    }
    return s;
  }

  StmtPtr parse_for() {
    const Token& t = cur();
    auto s = std::make_unique<Stmt>(StmtKind::kFor, t.line, t.column);
    advance();
    s->target = parse_assign_target(false, {"in"});
    if (!skip_name("in")) fail(cur(), fmt::format("expected 'in', got '{}'", describe(cur())));
    s->expr = parse_tuple(false, {"recursive"});
    if (skip_name("if")) s->condition = parse_expression(true);
    if (is_name("recursive")) fail(cur(), "recursive loops are not supported");
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"});
    --loop_depth_;
    std::string tag = cur().text;
    advance();
    if (tag == "else") {
      s->else_body = parse_body({"endfor"});
      advance();
    }
    return s;
  }

  StmtPtr parse_set() {
    const Token& t = cur();
    advance();
    Target target = parse_assign_target(true, {});
    if (skip_op("=")) {
      auto s = std::make_unique<Stmt>(StmtKind::kSet, t.line, t.column);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {});
      return s;
    }
    auto s = std::make_unique<Stmt>(StmtKind::kSetBlock, t.line, t.column);
    s->target = std::move(target);
    if (is_op("|")) s->expr = parse_filter_chain(nullptr, false);
    s->body = parse_body({"endset"});
    advance();
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    bool seen_default = false;
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) {
        p.default_value = parse_expression(true);
        seen_default = true;
      } else if (seen_default) {
        fail(cur(), "non-default argument follows default argument");
      }
      s.params.push_back(std::move(p));
    }
    expect_op(")");
  }

  StmtPtr parse_macro() {
    const Token& t = cur();
    auto s = std::make_unique<Stmt>(StmtKind::kMacro, t.line, t.column);
    advance();
    s->text = expect_name();
    parse_signature(*s);
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved_loop_depth;
    advance();
    return s;
  }

  StmtPtr parse_call_block() {
    const Token& t = cur();
    auto s = std::make_unique<Stmt>(StmtKind::kCallBlock, t.line, t.column);
    advance();
    if (is_op("(")) parse_signature(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::kCall) fail(t, "expected call");
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endcall"});
    loop_depth_ = saved_loop_depth;
    advance();
    return s;
  }

  StmtPtr parse_filter_block() {
    const Token& t = cur();
    auto s = std::make_unique<Stmt>(StmtKind::kFilterBlock, t.line, t.column);
    advance();
    s->expr = parse_filter_chain(nullptr, true);
    s->body = parse_body({"endfilter"});
    advance();
    return s;
  }

  StmtPtr parse_with() {
    const Token& t = cur();
    auto s = std::make_unique<Stmt>(StmtKind::kWith, t.line, t.column);
    advance();
    while (cur().type != TokenType::kBlockEnd) {
      if (!s->with_targets.empty()) expect_op(",");
      s->with_targets.push_back(parse_assign_target(false, {}));
      expect_op("=");
      s->with_values.push_back(parse_expression(true));
    }
    s->body = parse_body({"endwith"});
    advance();
    return s;
  }

  // Names, namespace attributes (set only) and tuples of them.
  Target parse_assign_target(bool with_namespace, std::initializer_list<std::string_view> extra_end) {
    std::vector<Target> elements;
    bool is_tuple = false;
    while (true) {
      if (!elements.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      bool parenthesized = skip_op("(");
      Target t;
      if (parenthesized) {
        t = parse_assign_target(false, {});
        expect_op(")");
      } else {
        const Token& tok = cur();
        std::string name = expect_name();
        if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
            name == "None") {
          fail(tok, "can't assign to 'const'");
        }
        if (with_namespace && is_op(".")) {
          advance();
          t.kind = Target::Kind::kNamespaceAttr;
          t.name = name;
          t.attr = expect_name();
        } else {
          t.name = name;
        }
      }
      elements.push_back(std::move(t));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (elements.empty()) fail(cur(), "expected an assignment target");
    if (!is_tuple) return std::move(elements[0]);
    Target tuple;
    tuple.kind = Target::Kind::kTuple;
    tuple.elements = std::move(elements);
    return tuple;
  }

  // ---- expressions ----

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    if (cur().type == TokenType::kVarEnd || cur().type == TokenType::kBlockEnd || is_op(")")) return true;
    if (cur().type == TokenType::kEof) return true;
    if (cur().type == TokenType::kName) {
      for (std::string_view e : extra_end) {
        if (cur().text == e) return true;
      }
    }
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end,
                      bool explicit_parentheses = false) {
    const Token& start = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) fail(cur(), fmt::format("Expected an expression, got '{}'", describe(cur())));
    }
    auto e = make(ExprKind::kTuple, start);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    if (!with_condexpr) return parse_or();
    const Token& start = cur();
    ExprPtr expr = parse_or();
    while (skip_name("if")) {
      auto c = make(ExprKind::kCondition, start);
      c->arg = parse_or();
      if (skip_name("else")) c->third = parse_expression(true);
      c->object = std::move(expr);
      expr = std::move(c);
    }
    return expr;
  }

  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, const Token& at) {
    auto e = make(ExprKind::kBinary, at);
    e->name = op;
    e->object = std::move(left);
    e->arg = std::move(right);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    ChainDepth chain(*this);
    while (is_name("or")) {
      chain.wrap();
      const Token& t = cur();
      advance();
      left = binary("or", std::move(left), parse_and(), t);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    ChainDepth chain(*this);
    while (is_name("and")) {
      chain.wrap();
      const Token& t = cur();
      advance();
      left = binary("and", std::move(left), parse_not(), t);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      const Token& t = cur();
      advance();
      auto e = make(ExprKind::kUnary, t);
      e->name = "not";
      e->object = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& start = cur();
    ExprPtr expr = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOperator &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == TokenType::kName && peek().text == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::kCompare, start);
        cmp->object = std::move(expr);
      }
      if (cmp->ops.size() >= static_cast<size_t>(limits_.max_depth)) fail(cur(), "comparison chain too long");
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    ChainDepth chain(*this);
    while (is_op("+") || is_op("-")) {
      chain.wrap();
      const Token& t = cur();
      std::string op = t.text;
      advance();
      left = binary(op, std::move(left), parse_concat(), t);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    ChainDepth chain(*this);
    while (is_op("~")) {
      chain.wrap();
      const Token& t = cur();
      advance();
      left = binary("~", std::move(left), parse_math2(), t);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    ChainDepth chain(*this);
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      chain.wrap();
      const Token& t = cur();
      std::string op = t.text;
      advance();
      left = binary(op, std::move(left), parse_pow(), t);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    ChainDepth chain(*this);
    while (is_op("**")) {
      chain.wrap();
      const Token& t = cur();
      advance();
      left = binary("**", std::move(left), parse_unary(true), t);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const Token& t = cur();
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      advance();
      node = make(ExprKind::kUnary, t);
      node->name = t.text;
      node->object = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    DepthGuard guard(*this);
    const Token& t = cur();
    switch (t.type) {
      case TokenType::kName: {
        advance();
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = make(ExprKind::kConst, t);
          e->value = Value::boolean(t.text == "true" || t.text == "True");
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          auto e = make(ExprKind::kConst, t);
          e->value = Value::none();
          return e;
        }
        auto e = make(ExprKind::kName, t);
        e->name = t.text;
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (cur().type == TokenType::kString) {
          s += cur().text;
          advance();
        }
        auto e = make(ExprKind::kConst, t);
        e->value = Value::string(std::move(s));
        return e;
      }
      case TokenType::kInteger: {
        advance();
        auto e = make(ExprKind::kConst, t);
        e->value = Value::integer(t.int_value);
        return e;
      }
      case TokenType::kFloat: {
        advance();
        auto e = make(ExprKind::kConst, t);
        e->value = Value::number(t.float_value);
        return e;
      }
      case TokenType::kOperator:
        if (t.text == "(") {
          advance();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    fail(t, fmt::format("unexpected '{}'", describe(t)));
  }

  ExprPtr parse_list() {
    const Token& t = cur();
    expect_op("[");
    auto e = make(ExprKind::kList, t);
    while (!is_op("]")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("]")) break;
      e->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    const Token& t = cur();
    expect_op("{");
    auto e = make(ExprKind::kDict, t);
    while (!is_op("}")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("}")) break;
      e->items.push_back(parse_expression(true));
      expect_op(":");
      e->values.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    ChainDepth chain(*this);
    while (true) {
      if (is_op(".") || is_op("[")) {
        chain.wrap();
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        chain.wrap();
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    ChainDepth chain(*this);
    while (true) {
      if (is_op("|")) {
        node = parse_filter_chain(std::move(node), false);
      } else if (is_name("is")) {
        chain.wrap();
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        chain.wrap();
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard guard(*this);
    const Token& t = cur();
    if (skip_op(".")) {
      const Token& attr = cur();
      if (attr.type == TokenType::kName) {
        advance();
        auto e = make(ExprKind::kGetAttr, t);
        e->object = std::move(node);
        e->name = attr.text;
        return e;
      }
      if (attr.type != TokenType::kInteger) fail(attr, "expected name or number");
      advance();
      auto e = make(ExprKind::kGetItem, t);
      e->object = std::move(node);
      e->arg = make(ExprKind::kConst, attr);
      e->arg->value = Value::integer(attr.int_value);
      return e;
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(ExprKind::kGetItem, t);
    e->object = std::move(node);
    if (args.size() == 1) {
      e->arg = std::move(args[0]);
    } else {
      e->arg = make(ExprKind::kTuple, t);
      e->arg->items = std::move(args);
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    const Token& t = cur();
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    advance();  // the first ':'
    auto slice = make(ExprKind::kSlice, t);
    slice->object = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) slice->arg = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) slice->third = parse_expression(true);
    }
    return slice;
  }

  void parse_call_args(Expr& e) {
    const Token& open = cur();
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        if (e.dyn_args || e.dyn_kwargs) fail(open, "invalid syntax for function call expression");
        advance();
        e.dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        if (e.dyn_kwargs) fail(open, "invalid syntax for function call expression");
        advance();
        e.dyn_kwargs = parse_expression(true);
      } else if (cur().type == TokenType::kName && peek().type == TokenType::kOperator && peek().text == "=") {
        if (e.dyn_kwargs) fail(open, "invalid syntax for function call expression");
        std::string key = cur().text;
        advance();
        advance();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (e.dyn_args || e.dyn_kwargs || !e.kwargs.empty()) fail(open, "invalid syntax for function call expression");
        e.items.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    DepthGuard guard(*this);
    auto e = make(ExprKind::kCall, cur());
    e->object = std::move(node);
    parse_call_args(*e);
    return e;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (is_op(".")) {
      advance();
      name += "." + expect_name();
    }
    return name;
  }

  // `| name(args) | name ...`; `start_inline` parses the first filter without a leading pipe.
  ExprPtr parse_filter_chain(ExprPtr node, bool start_inline) {
    ChainDepth chain(*this);
    while (is_op("|") || start_inline) {
      chain.wrap();
      if (!start_inline) advance();
      const Token& t = cur();
      auto e = make(ExprKind::kFilter, t);
      e->name = parse_dotted_name();
      if (is_op("(")) parse_call_args(*e);
      e->object = std::move(node);
      node = std::move(e);
      start_inline = false;
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    DepthGuard guard(*this);
    const Token& t = cur();
    advance();  // 'is'
    auto e = make(ExprKind::kTest, t);
    e->negated = skip_name("not");
    e->name = parse_dotted_name();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == TokenType::kName || cur().type == TokenType::kString ||
                cur().type == TokenType::kInteger || cur().type == TokenType::kFloat || is_op("(") || is_op("[") ||
                is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail(cur(), "You cannot chain multiple tests with is");
      e->items.push_back(parse_postfix(parse_primary()));
    }
    e->object = std::move(node);
    return e;
  }

  const std::vector<Token>& toks_;
  ParserLimits limits_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const ParserLimits& limits) {
  if (tokens.empty()) return {};
  return Parser(tokens, limits).parse_template();
}

}  // namespace dflash::jinja
