#pragma once
// Host memory for offloaded activations (internal; docs/runtime.md, "Offload"): blocks taken
// by a step's copies to host memory and given back once the activation is on the device again,
// kept from step to step by the Checkpointable that owns the pool, so that a step allocates
// none once the first has run.
//
// On the CPU a block is plain host memory outside LibTorch's allocators: the CPU tracker, which
// counts the device's (here the CPU's) tensor storage, does not count it, as a GPU's tracker
// does not count host memory. On a GPU it is pinned host memory (a tensor from LibTorch's host
// allocator), so that copies to and from it run asynchronously on the copy streams, and it
// carries the event of the last copy from or into it: a copy that reuses the block waits for it
// on its own stream.
#include <c10/core/Event.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace remat::detail {

class HostPool {
 public:
  struct Block {
    std::int64_t capacity = 0;  // bytes
    std::int64_t used = 0;      // bytes of the copy it holds (counted by the pool while taken)
    std::unique_ptr<char[]> cpu;
    torch::Tensor pinned;  // uint8, `capacity` elements
    // The last copy from or into the block (GPU only): the next one waits for it.
    std::shared_ptr<c10::Event> last_copy;
    // `bytes` of it: a CPU tensor on its memory (not allocated by LibTorch).
    torch::Tensor bytes(std::int64_t count) const;
  };
  using Lease = std::unique_ptr<Block>;

  /// A block of at least `bytes`, pinned or not: the smallest idle one that fits, else a new one.
  Lease take(std::int64_t bytes, bool pinned);
  /// Gives a block back for the next take(). A null lease is ignored.
  void give_back(Lease block);
  /// Frees the idle blocks (those given back).
  void free_idle();

  struct Stats {
    std::int64_t in_use_bytes = 0;  // the copies held now (their own sizes)
    std::int64_t peak_bytes = 0;    // the most in_use_bytes since the last reset_peak()
    std::int64_t held_bytes = 0;    // the capacity of every block, taken or idle
    std::int64_t blocks = 0;        // blocks allocated since the pool was made
  };
  Stats stats() const;
  void reset_peak();

 private:
  mutable std::mutex mutex_;
  std::multimap<std::int64_t, Lease> idle_cpu_, idle_pinned_;  // by capacity
  Stats stats_;
};

}  // namespace remat::detail
