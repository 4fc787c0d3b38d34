// Errors as values: every fallible Kiln call returns Result<T>; nothing in the library aborts or
// exits. Only the CLI's outer layer turns an Error into "kiln: error: ..." and an exit code.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kiln {

/// What went wrong, coarsely, so callers can branch without parsing messages.
enum class Errc {
  invalid_argument,    ///< A request the op cannot serve (bad shape, dtype, parameter).
  not_found,           ///< No op, dtype, target, model or backend of that name.
  unsupported,         ///< Valid, but this build or target cannot do it (e.g. AMD without LLVM).
  compile_failed,      ///< The compiler rejected the generated source (the log is in the message).
  driver_unavailable,  ///< libcuda / libamdhip64 / libnvrtc could not be loaded, or no device.
  driver_error,        ///< A driver call returned an error code.
  io_error,            ///< A file system operation failed.
  corrupt,             ///< A cache entry or input file is malformed or fails its checksum.
  timeout,             ///< Waiting for another process's compile took too long.
};

/// Human-readable name of an error code ("invalid_argument", ...).
std::string_view errc_name(Errc code);

/// An error: a code and a one-line message that names the input at fault and, where there is one,
/// the fix. Compiler errors append the compiler log on the following lines.
struct Error {
  Errc code = Errc::invalid_argument;
  std::string message;
};

/// Either a T or an Error. Modeled on std::expected / llvm::Expected, kept minimal because the
/// project is C++20 and libstdc++ 12 has no std::expected there.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT: implicit
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT: implicit

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(v_); }
  Error&& take_error() { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

/// Result<void>: success or an Error.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}  // NOLINT: implicit
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return err_; }
  Error&& take_error() { return std::move(err_); }

 private:
  Error err_;
  bool ok_ = true;
};

/// Success for Result<void>.
inline Result<void> ok() { return {}; }

/// Builds an Error; the message should name the input at fault and the fix.
inline Error make_error(Errc code, std::string message) { return Error{code, std::move(message)}; }

}  // namespace kiln

/// Propagates an error from a Result-returning expression: `KILN_TRY(write(...));`
#define KILN_TRY(expr)                                   \
  do {                                                   \
    auto kiln_try_result_ = (expr);                      \
    if (!kiln_try_result_.ok()) return kiln_try_result_.take_error(); \
  } while (0)

#define KILN_CONCAT_INNER_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT_INNER_(a, b)
/// `KILN_ASSIGN_OR_RETURN(auto x, make_x());` binds the value or returns the error.
#define KILN_ASSIGN_OR_RETURN(decl, expr)                                   \
  auto KILN_CONCAT_(kiln_res_, __LINE__) = (expr);                          \
  if (!KILN_CONCAT_(kiln_res_, __LINE__).ok())                              \
    return KILN_CONCAT_(kiln_res_, __LINE__).take_error();                  \
  decl = std::move(KILN_CONCAT_(kiln_res_, __LINE__)).value()
