#pragma once
/// Error helpers of every component: REMAT_CHECK for bad input (throws std::invalid_argument)
/// and REMAT_INTERNAL_ASSERT for invariants (throws std::logic_error naming it a bug).

#include <sstream>
#include <stdexcept>
#include <string>

namespace remat {
namespace detail {

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace detail
}  // namespace remat

/// Throws std::invalid_argument with the concatenated message when `cond` is false.
/// Example: REMAT_CHECK(slots > 0, "slots must be positive, got ", slots);
#define REMAT_CHECK(cond, ...)                                                       \
  do {                                                                               \
    if (!(cond)) throw std::invalid_argument(::remat::detail::str_cat(__VA_ARGS__)); \
  } while (false)

/// Checks an invariant of remat itself; a failure is a bug in remat, not bad input.
/// Example: REMAT_INTERNAL_ASSERT(peak <= budget, "peak ", peak);
#define REMAT_INTERNAL_ASSERT(...) REMAT_INTERNAL_ASSERT_IMPL(__VA_ARGS__, "")
#define REMAT_INTERNAL_ASSERT_IMPL(cond, ...)                                                 \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw std::logic_error(::remat::detail::str_cat("this is a bug in remat: ", #cond,      \
                                                      " failed at ", __FILE__, ":", __LINE__, \
                                                      ": ", __VA_ARGS__));                    \
  } while (false)
