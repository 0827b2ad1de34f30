// Errors the engine raises. One type, so the CLI and the Lua bindings can turn any engine
// failure into a single clear message (no C++ stack dump reaches the user).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace me {

// A user-facing failure: bad input, a layout that does not divide, a missing file...
// The message names the thing that is wrong and, where possible, how to fix it.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Concatenates anything streamable: me::cat("world size ", n, " is not divisible by ", k).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(cat(std::forward<Args>(args)...));
}

}  // namespace me

// ME_CHECK(cond, "message parts", ...) throws me::Error when cond is false.
#define ME_CHECK(cond, ...)                 \
  do {                                      \
    if (!(cond)) ::me::fail(__VA_ARGS__);   \
  } while (0)
