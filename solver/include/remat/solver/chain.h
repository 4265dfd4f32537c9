#pragma once
/// The chain cost model (docs/cost-model.md) and its JSON file format, `remat-chain/1`.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace remat {

/// Format tag written in and required from every chain file.
inline constexpr const char* kChainFormat = "remat-chain/1";

/// Largest byte count a chain may hold in one field (2^50 bytes = 1 PiB): sums of a few
/// thousand such numbers still fit in int64, and JSON readers keep them exact.
inline constexpr std::int64_t kMaxChainBytes = std::int64_t{1} << 50;

/// One stage of a chain: maps x_i to x_{i+1}. Times in milliseconds, sizes in bytes.
struct Stage {
  std::string name;
  /// Forward time with autograd (the `Fe` operation).
  double fwd_ms = 0;
  /// Backward time (the `B` operation).
  double bwd_ms = 0;
  /// Size of the output x_{i+1}; its gradient has the same size.
  std::int64_t out_bytes = 0;
  /// Everything the stage keeps alive when run with autograd, its output included.
  std::int64_t saved_bytes = 0;
  /// Transient peak during the forward, above what the model already counts.
  std::int64_t fwd_tmp_bytes = 0;
  /// Transient peak during the backward, above what the model already counts.
  std::int64_t bwd_tmp_bytes = 0;
  /// Forward time without autograd (`Fn`, `CF`); absent means equal to `fwd_ms`.
  std::optional<double> fwd_nograd_ms;

  /// The time of a forward without autograd: `fwd_nograd_ms` if given, else `fwd_ms`.
  double nograd_ms() const { return fwd_nograd_ms.value_or(fwd_ms); }
};

/// A chain of L stages; x_0 is the input, x_L the output fed to the loss.
struct Chain {
  std::string name;
  /// Size of the input x_0 (and of its gradient).
  std::int64_t input_bytes = 0;
  std::vector<Stage> stages;
  /// Transient peak of the loss computation and its backward.
  std::int64_t loss_tmp_bytes = 0;

  /// Number of stages L.
  int length() const { return static_cast<int>(stages.size()); }
  /// Size of x_k for 0 <= k <= L: the input for k = 0, else stages[k-1].out_bytes.
  std::int64_t activation_bytes(int k) const;
  /// Time of store-all: every forward with autograd, then every backward.
  double store_all_ms() const;

  /// Checks every invariant of the cost model; throws ChainError naming `source`, the stage
  /// index and the field. Example: `chain.validate("resnet.json")`.
  void validate(const std::string& source = "chain") const;
};

/// A chain that breaks the format or the cost model: bad file, bad field, bad value.
class ChainError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Parses and validates a `remat-chain/1` document; `source` names it in error messages.
Chain parse_chain(const std::string& json_text, const std::string& source = "chain");
/// Reads and validates a chain file. Throws ChainError (file missing, not JSON, invalid).
Chain load_chain(const std::string& path);
/// Serializes a chain as a `remat-chain/1` document (2-space indented JSON).
std::string chain_to_json(const Chain& chain);
/// Writes a chain file atomically: a temporary file in the same folder, then a rename, so a
/// failure leaves no half-written file. Throws std::runtime_error on I/O failure.
void save_chain(const Chain& chain, const std::string& path);

}  // namespace remat
