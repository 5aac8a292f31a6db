// The one exception type used *inside* the Jinja engine; the public API (template.h) turns it into a Status.
//
// Why an exception here when the project's errors are values: evaluation is deeply recursive and
// nearly every step (attribute access, arithmetic, each builtin) can fail on hostile input. Threading
// Result<Value> through hundreds of call sites would bury the semantics; instead every failure throws
// jinja::Error, and Template::parse / Template::render catch it (and std::exception) at the boundary.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dflash::jinja {

enum class ErrorKind {
  kSyntax,     // the template text is malformed (line/column known)
  kUndefined,  // use of an undefined value where Jinja raises UndefinedError
  kType,       // Python TypeError / ValueError equivalents
  kSecurity,   // what the immutable sandbox forbids (mutating methods, huge ranges)
  kRaised,     // raise_exception(msg) in the template
  kLimit,      // a configured limit (output size, steps, depth) was exceeded
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, int line = 0, int column = 0)
      : std::runtime_error(message), kind_(kind), message_(std::move(message)), line_(line), column_(column) {}

  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  int column() const { return column_; }
  // Attaches a source position if none is known yet.
  void set_position(int line, int column) {
    if (line_ == 0) {
      line_ = line;
      column_ = column;
    }
  }

 private:
  ErrorKind kind_;
  std::string message_;
  int line_;
  int column_;
};

template <typename... Args>
[[noreturn]] void throw_error(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(kind, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dflash::jinja
