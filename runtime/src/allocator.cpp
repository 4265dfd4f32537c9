#include "remat/runtime/allocator.h"

#include <c10/util/Exception.h>

#include <limits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace remat {

bool keep_freed_memory(std::int64_t pad_bytes) {
  TORCH_CHECK_VALUE(pad_bytes >= 0 && pad_bytes <= (std::int64_t{1} << 30),
                    "remat::keep_freed_memory: pad_bytes must be in [0, 1 GiB], got ", pad_bytes);
#if defined(__GLIBC__)
  // Blocks up to 32 MiB (the most glibc allows) come from the heap rather than from mmap,
  // which would unmap them at every free; the heap is never trimmed by free() (what the
  // process has used it keeps), and grows pad_bytes beyond what it needs.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;
  const bool pad_ok = mallopt(M_TOP_PAD, static_cast<int>(pad_bytes)) == 1;
  return mmap_ok && trim_ok && pad_ok;
#else
  return false;
#endif
}

}  // namespace remat
