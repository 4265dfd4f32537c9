#include "remat/runtime/allocator.h"

#include <stdexcept>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace remat {

bool keep_freed_memory(std::int64_t pad_bytes) {
  if (pad_bytes < 0 || pad_bytes > (std::int64_t{1} << 30))
    throw std::invalid_argument("keep_freed_memory: pad_bytes must be in [0, 1 GiB], got " +
                                std::to_string(pad_bytes));
#if defined(__GLIBC__)
  return mallopt(M_TOP_PAD, static_cast<int>(pad_bytes)) == 1;
#else
  return false;
#endif
}

}  // namespace remat
