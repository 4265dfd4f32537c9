#pragma once
// remat::distributed::DataParallel: data-parallel training of any module (a Checkpointable
// included) over a Group, as DistributedDataParallel does in Python: the parameters and
// buffers start as rank 0's, and each backward leaves every rank the gradients averaged over
// the ranks, by bucketed all-reduce that overlaps the backward.
//
//   auto group = remat::distributed::Group::create(Environment::from_env(), torch::kCPU);
//   remat::Checkpointable chk(net);
//   remat::distributed::share_chain(*chk, *group, {sample});  // rank 0 measures, all get the chain
//   remat::distributed::solve(*chk, *group, SolveOptions(budget));  // the same schedule on all
//   remat::distributed::DataParallel dp(chk.ptr(), group);          // rank 0's weights everywhere
//   for (...) {
//     torch::Tensor loss = torch::nll_loss(chk->forward(x), target);
//     dp.backward(loss);          // the checkpointed backward, gradients averaged over ranks
//     optimizer.step();
//   }
//
// The gradients live in the buckets: each parameter's .grad is a view of its bucket, so that
// communication needs no copy and no memory besides the gradients themselves (which a budget
// excludes, docs/cost-model.md). A bucket holds parameters of one dtype and device, in the
// reverse of parameters() order (the order a chain's backward finishes them), up to
// bucket_bytes. A parameter is ready when its gradient has been accumulated as many times as in
// the first step (a weight tied to two stages, like GPT-2's embedding and head, twice); a
// bucket's all-reduce is launched when all its parameters are ready and every earlier bucket
// has been launched, so that every rank launches them in the same order. In the first step the
// counts are learned and every bucket is launched after the backward.

#include <torch/nn/module.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "remat/core/autograd_node.h"
#include "remat/core/stage.h"
#include "remat/distributed/group.h"
#include "remat/runtime/checkpointable.h"

namespace remat::distributed {

struct DataParallelOptions {
  /// The largest bucket (a parameter larger than this has a bucket of its own). 25 MiB, as
  /// DistributedDataParallel's default.
  DataParallelOptions& bucket_bytes(std::int64_t value) {
    bucket_bytes_ = value;
    return *this;
  }
  /// Copy rank 0's buffers (BatchNorm's running statistics) to every rank after each backward,
  /// as DistributedDataParallel's broadcast_buffers does before each forward.
  DataParallelOptions& broadcast_buffers(bool value) {
    broadcast_buffers_ = value;
    return *this;
  }
  std::int64_t bucket_bytes() const { return bucket_bytes_; }
  bool broadcast_buffers() const { return broadcast_buffers_; }

 private:
  std::int64_t bucket_bytes_ = std::int64_t{25} << 20;
  bool broadcast_buffers_ = true;
};

/// Where the time of the last backward() went, in milliseconds.
struct StepTimes {
  /// From the call to the end of the local backward (recomputations included; on a GPU, to
  /// the end of its kernels).
  double backward_ms = 0;
  /// From the end of the local backward until every bucket's all-reduce was done: the part of
  /// the communication that the backward did not hide.
  double exposed_ms = 0;
  /// The all-reduces' own time, each from its launch to its completion, added up (they may
  /// overlap each other and the backward). NaN on a GPU, where NCCL's completion time is not
  /// known on the host (its work's future completes once the collective is queued).
  double all_reduce_ms = 0;
  /// The part of all_reduce_ms that ran while the local backward did: hidden by it. NaN on a
  /// GPU, as all_reduce_ms.
  double hidden_ms = 0;
  /// How many buckets were launched before the local backward ended.
  int overlapped_buckets = 0;
};

class DataParallel {
 public:
  /// See no_sync().
  class NoSync {
   public:
    explicit NoSync(DataParallel& dp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallel& dp_;
  };

  /// Checks that every rank has the same parameters and buffers (names, shapes, dtypes: an
  /// InputError naming the ranks that differ), copies rank 0's values to the others, and sets
  /// every parameter's gradient to a zeroed view of its bucket. The parameters that train are
  /// those that require grad now. A module that another DataParallel still trains is refused
  /// (an InputError naming a parameter): the gradients would go to one's buckets only.
  DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Group> group,
               const DataParallelOptions& options = DataParallelOptions());
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// loss.backward(), with the gradients' all-reduce overlapping it; returns when every
  /// parameter's .grad is the mean over the ranks of their gradients (accumulated into what
  /// .grad held, as backward() does; zero it between steps). A failure of another rank, or a
  /// collective that times out, is a DistributedError naming the rank. A parameter that
  /// requires grad but did not when the DataParallel was made (unfrozen, or new) is refused
  /// before the backward: its gradient would not be averaged.
  void backward(const torch::Tensor& loss);

  /// While the returned guard lives, a backward outside backward() (loss.backward())
  /// accumulates gradients on this rank without averaging them, as DDP's no_sync(); the next
  /// backward() averages everything accumulated. Outside such a guard, a gradient from a
  /// backward outside backward() is refused (an InputError thrown by that backward, naming the
  /// parameter): the ranks would go on training different models, without a word.
  ///   { auto local = dp.no_sync(); loss_of(micro_batch_1).backward(); }
  ///   dp.backward(loss_of(micro_batch_2));  // the mean over ranks of both micro-batches' sum
  [[nodiscard]] std::unique_ptr<NoSync> no_sync() { return std::make_unique<NoSync>(*this); }

  /// Bytes of each bucket, in launch order.
  std::vector<std::int64_t> bucket_bytes() const;
  const StepTimes& last_step() const { return last_step_; }
  Group& group() { return *group_; }

  /// The description of `module`'s parameters and buffers that the ranks compare: one line per
  /// tensor, "parameter <name> <dtype> [<sizes>]".
  static std::string describe(const torch::nn::Module& module);

 private:
  struct Bucket;
  void on_gradient(std::size_t parameter);
  void launch_ready();
  void launch(std::size_t bucket);
  void adopt_gradient(std::size_t parameter);
  void finish();
  void broadcast_from_rank0(std::vector<torch::Tensor> tensors, const std::string& what);

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<Group> group_;
  DataParallelOptions options_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<remat::detail::NodeHandle> accumulators_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::size_t> bucket_of_;      // per parameter
  std::vector<torch::Tensor> views_;        // per parameter: its slice of its bucket
  std::vector<int> expected_, received_;    // gradient accumulations per parameter
  bool learned_ = false;
  bool armed_ = false;        // in backward(): the hooks count
  std::atomic<int> no_sync_{0};  // NoSync guards alive
  void check_trainable() const;
  bool in_backward_ = false;  // the local backward has not returned
  std::shared_ptr<struct HookTarget> target_;  // what the hooks, which may outlive *this, call
  std::mutex mutex_;
  std::size_t next_launch_ = 0;
  std::string failure_;                     // an error inside a hook, reported by backward()
  StepTimes last_step_;
  std::int64_t steps_ = 0;
};

/// Rank 0 measures `chk` on its sample (remat::profile; its timings alone decide, so that
/// timing noise cannot make the ranks choose different schedules) and sends the chain to the
/// others, which take it (set_chain). Every rank must call it; the others' inputs are not used
/// and may be empty. Returns the chain, the same on every rank.
const Chain& share_chain(CheckpointableImpl& chk, Group& group, const Tensors& inputs,
                         const Tensors& context = {},
                         const ProfileOptions& profile_options = ProfileOptions());

/// chk.compute_sequence(options) on every rank (the budget is per rank), then checks that all
/// ranks have the same chain, status and sequence (an InputError naming the ranks otherwise).
const Solution& solve(CheckpointableImpl& chk, Group& group, const SolveOptions& options);

}  // namespace remat::distributed
