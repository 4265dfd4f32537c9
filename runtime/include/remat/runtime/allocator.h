#pragma once
// Keeping freed memory in the process between training steps.

#include <cstdint>

namespace remat {

/// Asks the C library's allocator to keep up to `pad_bytes` of freed memory at the top of
/// its heap instead of returning it to the operating system (glibc: mallopt(M_TOP_PAD)).
///
/// Why: a training step allocates and frees the same activations every step. With glibc's
/// defaults the heap is trimmed whenever enough memory at its top is free, and the next step
/// takes the same memory back page by page, each page a fault the kernel must zero: on the
/// CPU benchmarks of docs/performance.md that is 8,000-16,000 faults and 5-13% of a step.
/// How often it happens depends on the order of frees, so checkpointed schedules (which free
/// stage by stage) suffer more than plain autograd. With the pad, steps after the first fault
/// no page at all.
///
/// The setting is process-wide and lasts until changed: the process keeps up to `pad_bytes`
/// more memory mapped once it has used it. The `remat` commands call it at start-up unless
/// REMAT_MALLOC_DEFAULTS=1 is set; a library never calls it on its own.
///
/// Returns false where it does nothing (not glibc).
bool keep_freed_memory(std::int64_t pad_bytes = std::int64_t{256} << 20);

}  // namespace remat
