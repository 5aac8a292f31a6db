// Errors as values: Status (ok or a message a user can act on) and Result<T> (a value or a Status).
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace dflash {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // the caller (user, CLI flag, request) asked for something impossible
  kNotFound,         // a file, tensor, key or token that should exist does not
  kCorrupt,          // a file's content violates its format (bounds, counts, checksums)
  kUnsupported,      // valid but not handled by this build (a dtype, a family, a format version)
  kIo,               // the operating system refused (open, read, write, mmap)
  kOutOfMemory,
  kInternal,         // a bug: an invariant of our own code broke
  kCancelled,        // the work was stopped on purpose: its requester went away or its deadline passed
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "corrupt: gguf: tensor 'x' offset 12 is not aligned to 32"
  std::string to_string() const;

  // Prefixes context ("loading model.gguf: ") to the message; no-op for ok.
  Status with_context(std::string_view context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return Status(ErrorCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status corrupt(fmt::format_string<Args...> f, Args&&... args) {
  return Status(ErrorCode::kCorrupt, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status not_found(fmt::format_string<Args...> f, Args&&... args) {
  return Status(ErrorCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status unsupported(fmt::format_string<Args...> f, Args&&... args) {
  return Status(ErrorCode::kUnsupported, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status io_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(ErrorCode::kIo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(ErrorCode::kInternal, fmt::format(f, std::forward<Args>(args)...));
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> makes no sense");

 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok() && "Result built from an ok Status has no value");
    if (std::get<Status>(v_).ok()) v_ = Status(ErrorCode::kInternal, "Result built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const& {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  // On a temporary (`f().status()`), a copy: a reference would outlive the Result it points into (as in
  // DF_RETURN_IF_ERROR(f().status()), whose reference is bound after the temporary is gone).
  Status status() && { return ok() ? Status() : std::get<Status>(std::move(v_)); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

namespace detail {
inline Status to_status(Status s) { return s; }
template <typename T>
Status to_status(const Result<T>& r) { return r.status(); }
}  // namespace detail

}  // namespace dflash

#define DF_CONCAT_INNER(a, b) a##b
#define DF_CONCAT(a, b) DF_CONCAT_INNER(a, b)

// Returns the Status of `expr` (a Status or Result) from the enclosing function if it is an error.
#define DF_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                            \
    auto&& df_status_tmp_ = (expr);                                               \
    if (!df_status_tmp_.ok()) return ::dflash::detail::to_status(df_status_tmp_); \
  } while (0)

// `DF_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its error.
#define DF_ASSIGN_OR_RETURN(lhs, expr) DF_ASSIGN_OR_RETURN_IMPL(DF_CONCAT(df_result_, __LINE__), lhs, expr)
#define DF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
