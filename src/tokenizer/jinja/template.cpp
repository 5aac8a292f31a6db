#include "tokenizer/jinja/template.h"

#include <new>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"

namespace dflash::jinja {
namespace {

Status to_status(const Error& e) {
  std::string where;
  if (e.line() > 0) where = fmt::format(" (line {}, column {})", e.line(), e.column());
  switch (e.kind()) {
    case ErrorKind::kRaised: return Status(ErrorCode::kInvalidArgument, e.message());
    case ErrorKind::kSyntax: return invalid_argument("template syntax error{}: {}", where, e.message());
    case ErrorKind::kLimit: return invalid_argument("template exceeded a limit{}: {}", where, e.message());
    case ErrorKind::kSecurity: return invalid_argument("template blocked by the sandbox{}: {}", where, e.message());
    case ErrorKind::kUndefined:
    case ErrorKind::kType: return invalid_argument("template error{}: {}", where, e.message());
  }
  return invalid_argument("template error{}: {}", where, e.message());
}

// Jinja resolves filter and test names when it compiles a template, so an unknown one is a syntax
// error even where it never runs, except in "soft" positions (if/elif/else bodies, the branches of
// `a if c else b`, the right side of and/or), where Jinja defers the check to when it runs. A loop,
// macro, call or block body inside them is checked again.
class NameChecker {
 public:
  void body(const Body& b, bool soft) {
    for (const auto& s : b) stmt(*s, soft);
  }

 private:
  void stmt(const Stmt& s, bool soft) {
    bool inner_soft = soft;
    switch (s.kind) {
      case StmtKind::kIf:
        for (const auto& c : s.conditions) expr(*c, true);
        for (const auto& b : s.bodies) body(b, true);
        body(s.else_body, true);
        return;
      case StmtKind::kFor:
      case StmtKind::kMacro:
      case StmtKind::kCallBlock:
      case StmtKind::kFilterBlock:
      case StmtKind::kSetBlock:
      case StmtKind::kWith:
      case StmtKind::kScope: inner_soft = false; break;
      default: break;
    }
    if (s.expr) expr(*s.expr, soft);
    if (s.condition) expr(*s.condition, soft);
    body(s.body, inner_soft);
    body(s.else_body, inner_soft);
    for (const auto& p : s.params) {
      if (p.default_value) expr(*p.default_value, inner_soft);
    }
    for (const auto& v : s.with_values) expr(*v, soft);
  }

  void expr(const Expr& e, bool soft) {
    if (!soft && e.kind == ExprKind::kFilter && !find_filter(e.name)) {
      throw Error(ErrorKind::kSyntax, fmt::format("No filter named '{}'.", e.name), e.line, e.column);
    }
    if (!soft && e.kind == ExprKind::kTest && !find_test(e.name)) {
      throw Error(ErrorKind::kSyntax, fmt::format("No test named '{}'.", e.name), e.line, e.column);
    }
    bool soft_right = soft || e.kind == ExprKind::kCondition ||
                      (e.kind == ExprKind::kBinary && (e.name == "and" || e.name == "or"));
    bool soft_all = soft || e.kind == ExprKind::kCondition;
    if (e.object) expr(*e.object, soft_all);
    if (e.arg) expr(*e.arg, soft_right);
    for (const ExprPtr* p : {&e.third, &e.dyn_args, &e.dyn_kwargs}) {
      if (*p) expr(**p, soft_all);
    }
    for (const auto& i : e.items) expr(*i, soft_all);
    for (const auto& v : e.values) expr(*v, soft_all);
    for (const auto& [k, v] : e.kwargs) expr(*v, soft_all);
  }
};

}  // namespace

Result<Template> Template::parse(std::string_view source, const Limits& limits) {
  try {
    LexerLimits lexer_limits;
    lexer_limits.max_source_bytes = limits.max_template_bytes;
    std::vector<Token> tokens = tokenize(source, lexer_limits);
    ParserLimits parser_limits;
    parser_limits.max_depth = limits.max_nesting;
    auto body = std::make_shared<Body>(jinja::parse(tokens, parser_limits));
    NameChecker().body(*body, false);
    return Template(std::move(body), limits);
  } catch (const Error& e) {
    return to_status(e);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory while parsing the template");
  } catch (const std::exception& e) {
    return internal_error("parsing the template: {}", e.what());
  }
}

Result<std::string> Template::render(const Dict& context, const RenderOptions& options) const {
  try {
    std::function<std::time_t()> now = [t = options.now]() { return t ? *t : std::time(nullptr); };
    Interpreter interpreter(context, limits_.render, std::move(now));
    return interpreter.render(*body_);
  } catch (const Error& e) {
    return to_status(e);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory while rendering the template");
  } catch (const std::exception& e) {
    return internal_error("rendering the template: {}", e.what());
  }
}

Result<std::string> Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  if (!context.is_object()) return invalid_argument("template context must be a JSON object");
  Dict d;
  try {
    for (const auto& [k, v] : context.items()) d.set(std::string(k), from_json(v));
  } catch (const Error& e) {
    return to_status(e);
  }
  return render(d, options);
}

}  // namespace dflash::jinja
