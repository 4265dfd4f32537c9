#pragma once
// Errors in remat's LibTorch code, in LibTorch's own terms (c10/util/Exception.h), so that a C++
// caller catches them as it catches LibTorch's, and Python (the package) sees the right type:
//
//   bad input the caller can fix   TORCH_CHECK_VALUE(cond, ...)  -> c10::ValueError  (ValueError)
//                                  or a remat::InputError subclass (ProfileError, StageError,
//                                  StateDictError, WeightsError): also a c10::ValueError
//   a call out of order            TORCH_CHECK(cond, ...)        -> c10::Error       (RuntimeError)
//   out of memory                  LibTorch's c10::OutOfMemoryError                  (torch.OutOfMemoryError)
//   a broken invariant (our bug)   REMAT_INTERNAL_ASSERT(cond, ...) (remat/base/check.h) ->
//                                  std::logic_error "this is a bug in remat"   (RuntimeError)
//
// The `remat` command maps them to its exit codes: 2, 1, 4 and 1. (The solver, which builds
// without LibTorch, throws std::invalid_argument for bad input: REMAT_CHECK in solver/.)

#include <c10/util/Exception.h>

#include <string>

namespace remat {

/// Bad input, named by a remat component (the profiler, a stage, a file reader). A
/// c10::ValueError whose what() is the message alone: no C++ backtrace, since the message says
/// where the input was wrong.
class InputError : public c10::ValueError {
 public:
  explicit InputError(const std::string& message) : c10::ValueError(message, {}) {}
};

/// The message of an exception caught on the way: LibTorch's without its C++ backtrace.
inline std::string message_of(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error))
    return c10_error->what_without_backtrace();
  return error.what();
}

}  // namespace remat
