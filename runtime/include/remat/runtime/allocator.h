#pragma once
// Keeping freed memory in the process between training steps.

#include <cstdint>

namespace remat {

/// Asks the C library's allocator to keep freed memory in the process instead of returning
/// it to the operating system (glibc: mallopt M_MMAP_THRESHOLD 32 MiB, its largest, so that
/// blocks up to that size come from the heap; M_TRIM_THRESHOLD at its largest, so that free()
/// never shrinks the heap; M_TOP_PAD `pad_bytes`, so that the heap grows in large steps).
///
/// Why: a training step allocates and frees the same activations every step. With glibc's
/// defaults the heap is trimmed whenever enough memory at its top is free, and the next step
/// takes the same memory back page by page, each page a fault the kernel must zero: on the
/// CPU benchmarks of docs/performance.md that is 6,000-37,000 faults and 5-13% of a step.
/// How often it happens depends on the order of frees, so checkpointed schedules (which free
/// stage by stage) suffer more than plain autograd. With this setting, steps after the first
/// fault no page at all (blocks above 32 MiB are still mapped and unmapped by glibc).
///
/// The setting is process-wide and lasts until changed: the process keeps the memory it has
/// used (its resident size stays at its peak, plus up to `pad_bytes` mapped but untouched).
/// The `remat` commands call it at start-up unless REMAT_MALLOC_DEFAULTS=1 is set; the
/// library never calls it on its own.
///
/// Returns false where it does nothing (not glibc).
bool keep_freed_memory(std::int64_t pad_bytes = std::int64_t{256} << 20);

}  // namespace remat
