#pragma once
/// The chain cost model (docs/cost-model.md) and its JSON file format, `remat-chain/2`
/// (`remat-chain/1` files still load).

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace remat {

/// Format tags: version 2, written for every chain without a link; version 3, version 2 with
/// the device's link to host memory (Chain::link), written for a chain that has one; and
/// version 1, which still loads.
inline constexpr const char* kChainFormat = "remat-chain/2";
inline constexpr const char* kChainFormatV3 = "remat-chain/3";
inline constexpr const char* kChainFormatV1 = "remat-chain/1";

/// Largest byte count a chain may hold in one field (2^50 bytes = 1 PiB): JSON readers keep
/// such numbers exact.
inline constexpr std::int64_t kMaxChainBytes = std::int64_t{1} << 50;

/// Largest sum of a chain's sizes (2^60 bytes = 1 EiB): twice every activation (members
/// carried over a stage counted again, as the dynamic program counts them; twice for their
/// gradients), plus every state, every temporary, the context and the loss's temporary. Every
/// memory figure remat computes (a peak, a table entry, a sum of a few of those) is at most a
/// few times this, so no sum of sizes can overflow int64.
inline constexpr std::int64_t kMaxChainTotalBytes = std::int64_t{1} << 60;

/// Largest time a chain may hold in one field, in milliseconds (10^15 ms, about 31,700 years):
/// a schedule runs at most a few times kMaxStages^2 operations, so every sum of times the
/// solver forms stays finite and far from overflow (docs/algorithms.md, "Limits").
inline constexpr double kMaxStageMs = 1e15;

/// Most stages a chain may have. The optimal solver's tables hold about 120 bytes for every
/// pair of stages before their memory axis (docs/algorithms.md, "Limits"): 12 GB at 10,000
/// stages, and its time grows as the cube of the length; the heuristics' schedules grow as the
/// square (recompute-all runs L^2 / 2 forwards). Longer networks should be grouped into fewer
/// stages.
inline constexpr int kMaxStages = 10000;

/// The range of a link's bandwidths, in GB/s: from 1 MB/s, at which the largest activation
/// (kMaxChainBytes) still copies in at most kMaxStageMs, to 10^6 GB/s, a thousand times
/// NVLink-C2C's.
inline constexpr double kMinLinkGbps = 1e-3;
inline constexpr double kMaxLinkGbps = 1e6;

/// The link between the device and host memory, over which an activation can be offloaded
/// during the forward pass and prefetched back before its backward (docs/cost-model.md,
/// "Offload"). Copies run on their own engine in each direction, one copy at a time, and
/// overlap with compute.
struct Link {
  /// Bandwidth of device-to-host copies, in GB/s (10^9 bytes per second); > 0.
  double d2h_gbps = 0;
  /// Bandwidth of host-to-device copies, in GB/s; > 0.
  double h2d_gbps = 0;
  /// Fixed time of each copy, in milliseconds: a copy of `bytes` takes
  /// latency_ms + bytes / bandwidth.
  double latency_ms = 0;

  /// Time of a device-to-host copy of `bytes`, in ms.
  double d2h_ms(std::int64_t bytes) const {
    return latency_ms + static_cast<double>(bytes) / (d2h_gbps * 1e6);
  }
  /// Time of a host-to-device copy of `bytes`, in ms.
  double h2d_ms(std::int64_t bytes) const {
    return latency_ms + static_cast<double>(bytes) / (h2d_gbps * 1e6);
  }
  /// Throws std::invalid_argument, naming `source` and the field, for a bandwidth outside
  /// kMinLinkGbps..kMaxLinkGbps or a latency that is not a time a chain holds.
  void validate(const std::string& source = "link") const;
};

/// One tensor of an activation x_k (activations are tuples of tensors). Either a new storage
/// of `bytes` bytes, or a tensor of the previous activation passed on unchanged (a skip
/// carried over a stage): then it is that storage, counted once, not a copy.
struct Member {
  /// Counted size of its storage.
  std::int64_t bytes = 0;
  /// Whether it has a gradient (floating point, requiring grad); integer ids and boolean masks
  /// do not.
  bool grad = true;
  /// -1 for a new tensor; else the index, in the stage's input x_i, of the member it is.
  int carried_from = -1;
  /// Counted size of its gradient where it differs from `bytes`: the gradient is a tensor of
  /// the member's own elements, larger than its storage where the member is expanded (stride
  /// 0: a column broadcast to a matrix), smaller where the member is a slice of a larger
  /// storage. Absent: `bytes`.
  std::optional<std::int64_t> grad_bytes = std::nullopt;
  /// A member of the chain's output x_L only (Chain::validate refuses false elsewhere): whether
  /// the loss differentiates it. False for a member the loss does not read (a language model's
  /// logits beside its own loss): y_L then holds no gradient for it, and a stage that carries it on
  /// passes none back.
  bool loss_gradient = true;

  bool carried() const { return carried_from >= 0; }
  /// The bytes of its gradient: 0 without one, else `grad_bytes` if given, else `bytes`.
  std::int64_t gradient_size() const { return grad ? grad_bytes.value_or(bytes) : 0; }
  /// The bytes of its gradient in y_L, as a member of x_L: gradient_size() if the loss
  /// differentiates it, else 0.
  std::int64_t loss_gradient_size() const { return loss_gradient ? gradient_size() : 0; }
};

/// One stage of a chain: maps x_i to x_{i+1}. Times in milliseconds, sizes in bytes.
struct Stage {
  std::string name;
  /// Forward time with autograd (the `Fe` operation).
  double fwd_ms = 0;
  /// Backward time (the `B` operation).
  double bwd_ms = 0;
  /// The members of the output x_{i+1}, in order. A carried member repeats its source's
  /// `bytes` and `grad` (Chain::validate checks it; the file format fills them in).
  std::vector<Member> outputs;
  /// Members of the input x_i that the stage's backward keeps (indices into x_i).
  std::vector<int> saved_inputs;
  /// New members of the output x_{i+1} that the stage's backward keeps (indices into
  /// `outputs`).
  std::vector<int> saved_outputs;
  /// What the backward keeps besides those members: masks, statistics, intermediates.
  std::int64_t state_bytes = 0;
  /// Transient peak during the forward with autograd, above what the model already counts.
  std::int64_t fwd_tmp_bytes = 0;
  /// Transient peak during a forward without autograd; absent means equal to `fwd_tmp_bytes`.
  /// (Without autograd, intermediates a backward would keep are transient instead.)
  std::optional<std::int64_t> fwd_nograd_tmp_bytes;
  /// Transient peak during the backward, above what the model already counts.
  std::int64_t bwd_tmp_bytes = 0;
  /// Forward time without autograd (`Fn`, `CF`); absent means equal to `fwd_ms`.
  std::optional<double> fwd_nograd_ms;

  /// The time of a forward without autograd: `fwd_nograd_ms` if given, else `fwd_ms`.
  double nograd_ms() const { return fwd_nograd_ms.value_or(fwd_ms); }
  /// The transient of a forward without autograd: `fwd_nograd_tmp_bytes` if given, else
  /// `fwd_tmp_bytes`.
  std::int64_t nograd_tmp_bytes() const { return fwd_nograd_tmp_bytes.value_or(fwd_tmp_bytes); }
  /// Bytes of the output x_{i+1}, carried members included.
  std::int64_t out_bytes() const;
  /// Bytes the stage's autograd state holds beyond its input: state_bytes plus the saved
  /// output members (model v1's `saved_bytes` for a stage that keeps its whole output).
  std::int64_t kept_bytes() const;

  /// A stage with one differentiable output of `out_bytes` whose backward keeps its whole
  /// input and output plus `saved_bytes - out_bytes` more: the only kind of stage of model v1
  /// (`remat-chain/1`), where `saved_bytes` counts the output. Example:
  /// `Stage::keeping_all("conv1", 4096, 8192)`.
  static Stage keeping_all(std::string name, std::int64_t out_bytes, std::int64_t saved_bytes);
};

/// A chain of L stages; x_0 is the input, x_L the output fed to the loss.
struct Chain {
  std::string name;
  /// The members of the input x_0 (none is carried). The caller holds them for the whole step.
  std::vector<Member> inputs;
  /// Tensors every stage sees, given once per step and held by the caller (an attention
  /// mask, position ids): counted once, for the whole step; they have no gradient.
  std::int64_t context_bytes = 0;
  std::vector<Stage> stages;
  /// Transient peak of the loss computation and its backward.
  std::int64_t loss_tmp_bytes = 0;
  /// Whether the caller keeps x_L until the step ends (true: `out = model(x)`, the loss and
  /// its backward, as most training loops are written), or lets it go once the loss has its
  /// value (false: `loss(model(x)).backward()`; the step must be written so). With true, the
  /// model holds x_L's storages from the loss to the end, a recomputed x_L being another copy,
  /// and loss_tmp_bytes was measured with x_L held; with false, the runtime drops x_L after
  /// the loss, and loss_tmp_bytes was measured so.
  bool output_held = true;
  /// The extra time of a restart: a forward that comes right after a backward, as each
  /// recomputation begins. On a GPU the backward's engine call returns when its kernels are
  /// queued, and the GPU waits for the recomputation's first launches, which a forward within
  /// a pass hides behind the host's lead. The profiler measures it on CUDA; 0 on the CPU, where
  /// the backward runs on the calling thread. Each forward right after a backward costs this
  /// much more (docs/cost-model.md, "The time model").
  double restart_ms = 0;
  /// The device's link to host memory, measured by the profiler or given by the user: what
  /// offloading costs. Absent: nothing can be offloaded.
  std::optional<Link> link;

  /// Number of stages L.
  int length() const { return static_cast<int>(stages.size()); }
  /// The members of x_k, 0 <= k <= L.
  const std::vector<Member>& members(int k) const;
  /// The storages of x_first .. x_end, numbered: the members of x_first in order, then every
  /// member of x_{first+1} .. x_end that a stage makes, in order; a member carried on is the
  /// storage it was carried from.
  struct Storages {
    /// ids[k - first][m]: the storage of member m of x_k.
    std::vector<std::vector<int>> ids;
    /// makers[id]: the member that made storage id.
    std::vector<Member> makers;
  };
  /// The storages of x_first .. x_end, 0 <= first <= end <= L; end -1: L.
  Storages storages(int first = 0, int end = -1) const;
  /// Size of x_k for 0 <= k <= L, carried members included.
  std::int64_t activation_bytes(int k) const;
  /// Size of the gradient y_k: the members of x_k that have one (of x_L, those the loss
  /// differentiates: Member::loss_gradient).
  std::int64_t gradient_bytes(int k) const;
  /// Whether x_k (0 <= k <= L) has a member carried through stage k-1 with a gradient: that
  /// member's gradient in y_{k-1} is y_k's, into which stage k-1 adds its own, in place (as the
  /// simulator counts it; the runtime cuts its fused backward calls there, to make that sum).
  bool carries_gradient(int k) const;
  /// Size of the input x_0.
  std::int64_t input_bytes() const { return activation_bytes(0); }
  /// Sets x_0 to one tensor of `bytes`, with a gradient or not.
  void set_input(std::int64_t bytes, bool grad = true);
  /// Time of store-all: every forward with autograd, then every backward.
  double store_all_ms() const;
  /// The bytes of the members carried over a stage, summed over the activations x_1 ... x_L:
  /// what the dynamic program may count more than once (docs/algorithms.md, "Carried
  /// members"), each member's value or gradient, the larger (Member::grad_bytes); 0 when no
  /// member is carried, or only empty ones.
  std::int64_t carried_bytes() const;

  /// Checks every invariant of the cost model and the limits above (kMaxChainBytes per size,
  /// kMaxChainTotalBytes in all, kMaxStageMs per time, kMaxStages); throws ChainError naming
  /// `source`, the stage index and the field. Example: `chain.validate("resnet.json")`.
  void validate(const std::string& source = "chain") const;
};

/// A chain that breaks the format or the cost model: bad file, bad field, bad value.
class ChainError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Parses and validates a `remat-chain/3`, `remat-chain/2` or `remat-chain/1` document; `source`
/// names it in error messages. A version 1 stage becomes Stage::keeping_all (what model v1
/// assumed).
Chain parse_chain(const std::string& json_text, const std::string& source = "chain");
/// Reads and validates a chain file. Throws ChainError (file missing, not JSON, invalid).
Chain load_chain(const std::string& path);
/// Serializes a chain as a `remat-chain/2` document (2-space indented JSON), or `remat-chain/3`
/// where it has a link: the oldest version that holds it, so that older readers load it.
std::string chain_to_json(const Chain& chain);
/// Writes a chain file atomically: a temporary file in the same folder, then a rename, so a
/// failure leaves no half-written file. Throws std::runtime_error on I/O failure.
void save_chain(const Chain& chain, const std::string& path);

}  // namespace remat
