#pragma once
// remat::distributed::Group: the processes of a data-parallel job, on c10d (torch.distributed's
// C++ engine): a TCPStore rendezvous, and ProcessGroupGloo (CPU) or ProcessGroupNCCL (CUDA) for
// the collectives. remat adds what LibTorch's C++ frontend leaves to its users: reading
// torchrun's environment, refusing bad values, a heartbeat so that a failed collective names
// the rank that died or hangs, and checks that every rank runs the same thing.
//
//   auto env = remat::distributed::Environment::from_env();   // RANK, WORLD_SIZE, MASTER_ADDR, ...
//   auto group = remat::distributed::Group::create(env, torch::kCPU);
//   group->check_same("the model", description);             // refuses a rank that differs

#include <c10/core/Device.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "remat/core/error.h"

namespace remat::distributed {

/// The collectives remat uses, taken from a c10d process group of any type (ProcessGroupGloo,
/// ProcessGroupNCCL: they derive from c10d::Backend on LibTorch 2.x, c10d::ProcessGroup on
/// 1.13, and each has these calls). Example: Collectives::of(gloo).
struct Collectives {
  std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)> allreduce;
  std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&, int root)> broadcast;
  std::function<c10::intrusive_ptr<c10d::Work>()> barrier;
  int rank = 0;
  int size = 1;
  c10::intrusive_ptr<c10::intrusive_ptr_target> owner;  // keeps the process group alive

  template <typename ProcessGroup>
  static Collectives of(const c10::intrusive_ptr<ProcessGroup>& group) {
    Collectives c;
    ProcessGroup* g = group.get();
    c.allreduce = [g](std::vector<at::Tensor>& tensors) { return g->allreduce(tensors); };
    c.broadcast = [g](std::vector<at::Tensor>& tensors, int root) {
      c10d::BroadcastOptions options;
      options.rootRank = root;
      return g->broadcast(tensors, options);
    };
    c.barrier = [g] { return g->barrier(); };
    c.rank = group->getRank();
    c.size = group->getSize();
    c.owner = group;
    return c;
  }
};

/// A rank failed, stopped answering or timed out, or the job could not start: what happened
/// and, where it could be found out, which ranks are to blame (failed_ranks()). Raised on the
/// surviving ranks; `remat train` exits with code 5 for it.
class DistributedError : public c10::Error {
 public:
  DistributedError(const std::string& message, std::vector<int> failed_ranks)
      : c10::Error(message, {}), failed_ranks_(std::move(failed_ranks)) {}
  /// The ranks found to have died, hung or failed (empty when none could be named).
  const std::vector<int>& failed_ranks() const { return failed_ranks_; }

 private:
  std::vector<int> failed_ranks_;
};

/// The most ranks of a job (WORLD_SIZE, --nproc): every rank joins one rendezvous store.
inline constexpr int kMaxRanks = 65536;

/// Where this process is in the job: torchrun's environment variables, or the same values
/// given by hand (`remat train --rank/--master`).
struct Environment {
  int rank = 0;
  int world_size = 1;
  /// The rank among the processes of this machine (which GPU it uses: cuda:local_rank).
  int local_rank = 0;
  /// The host of rank 0, where the rendezvous store listens.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;

  /// Reads RANK, WORLD_SIZE, LOCAL_RANK (default: RANK), MASTER_ADDR (default 127.0.0.1) and
  /// MASTER_PORT (default 29500), as torchrun sets them. A value that is not a whole number in
  /// range (rank < world size, port 1-65535), or RANK without WORLD_SIZE, is an InputError
  /// naming the variable and its value.
  static Environment from_env();
  /// Whether torchrun's variables are set (RANK or WORLD_SIZE).
  static bool in_env();
  /// Throws InputError (naming `source`, e.g. "--rank" or "RANK") unless the values are valid.
  void check(const std::string& source) const;
};

enum class BackendKind { kAuto, kGloo, kNccl };
/// "auto", "gloo" or "nccl"; anything else is an InputError.
BackendKind parse_backend(const std::string& name);
/// Gloo for the CPU, NCCL for CUDA, unless `kind` names one.
BackendKind resolve_backend(BackendKind kind, c10::Device device);
/// Throws InputError unless backend `kind` (resolved) can serve `device`: NCCL needs a CUDA
/// device and a build with NCCL.
void check_backend(BackendKind kind, c10::Device device);
const char* backend_name(BackendKind kind);
/// Whether this build can use NCCL (a LibTorch with CUDA and NCCL's headers).
bool has_nccl();
/// "HOST:PORT" as in a URL: an IPv6 address in brackets ("[::1]:29500").
std::string host_port(const std::string& host, int port);

struct GroupOptions {
  /// Which c10d backend; kAuto chooses by device.
  GroupOptions& backend(BackendKind value) {
    backend_ = value;
    return *this;
  }
  /// How long a rank waits for the others, in the rendezvous and in every collective, before it
  /// gives up with a DistributedError; a rank that dies is noticed sooner: in a collective as
  /// soon as its connections close, in the store's waits (broadcast, check_same, barrier) when
  /// its heartbeat has been still for 10 beats (a beat is a tenth of the timeout, from 50 ms
  /// to 1 s; 10 beats are at least 2 s, at most the timeout).
  GroupOptions& timeout(std::chrono::milliseconds value) {
    timeout_ = value;
    return *this;
  }
  /// How long the rendezvous waits for every rank to start and join, and the store's waits
  /// (start-up checks) last; 0 (the default): timeout().
  GroupOptions& startup_timeout(std::chrono::milliseconds value) {
    startup_timeout_ = value;
    return *this;
  }
  /// On a rank other than 0, the exit code of the process when a std::system_error escapes a
  /// thread other than the one that called Group::create: LibTorch 1.13's store thread (the
  /// listener of watchKey, on every rank) lets the error of a reset connection to rank 0's
  /// store escape, and the rank would otherwise die of SIGABRT. The process prints "remat: rank
  /// R: rank 0 stopped answering (the connection to the rendezvous store it hosts at HOST:PORT
  /// failed; LibTorch's store thread said: ...)" and exits with this code (default 5, as
  /// `remat train`); anything else goes on to the previous terminate handler. 0: no handler.
  GroupOptions& store_thread_exit_code(int value) {
    store_thread_exit_code_ = value;
    return *this;
  }
  BackendKind backend() const { return backend_; }
  int store_thread_exit_code() const { return store_thread_exit_code_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::chrono::milliseconds startup_timeout() const {
    return startup_timeout_.count() > 0 ? startup_timeout_ : timeout_;
  }

 private:
  BackendKind backend_ = BackendKind::kAuto;
  std::chrono::milliseconds timeout_ = std::chrono::seconds(300);
  std::chrono::milliseconds startup_timeout_{0};
  int store_thread_exit_code_ = 5;
};

/// The processes of one job. Every collective call must be made by every rank, in the same
/// order, as with torch.distributed.
class Group {
 public:
  /// The rendezvous at env.master_addr:env.master_port (rank 0 hosts the store) and the
  /// backend's process group for `device`. Waits at most the timeout for every rank to join;
  /// a rank that does not is named in the DistributedError.
  static std::shared_ptr<Group> create(const Environment& env, c10::Device device,
                                       const GroupOptions& options = GroupOptions());
  /// A group on a store and process group made by the caller (its own rendezvous). The
  /// heartbeat, and with it naming a rank that hangs, needs the store's address: without
  /// `env`, a failure names only the ranks that reported their own error.
  /// Example: Group(store, Collectives::of(my_process_group), std::chrono::minutes(5)).
  Group(c10::intrusive_ptr<c10d::Store> store, Collectives collectives,
        std::chrono::milliseconds timeout, std::optional<Environment> env = std::nullopt);
  /// Leaves the job (leave()) and stops the heartbeat. After a failure (failed()) the backend's
  /// process group is abandoned, not destroyed: its threads may still wait inside a collective
  /// for the lost rank, and its destructor would wait for every such collective to time out on
  /// its own. The process's exit reclaims it.
  ~Group();
  /// Tells the others this rank is leaving. Rank 0, which hosts the store, then waits (at most
  /// the timeout) until every other rank has left or stopped answering, so that a rank still
  /// finding out who failed can ask the store; it does not wait for a rank that failure() named.
  /// Never throws; the destructor calls it.
  void leave() noexcept;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// The process group's collectives (in-place all-reduce sum, broadcast, barrier).
  const Collectives& collectives() const { return collectives_; }
  c10d::Store& store() { return *store_; }

  /// Returns rank 0's `value` on every rank (through the store). While rank 0 works (profiles,
  /// for as long as it takes) the others wait, and stop if its heartbeat stops or a rank
  /// reports a failure (report_failure: rank 0 could not read its --chain).
  std::string broadcast(const std::string& what, const std::string& value);
  /// Every rank gives `value`; returns if all equal rank 0's, else throws InputError on every
  /// rank naming `what`, the ranks that differ and the first line where they do. Like
  /// broadcast, a failure another rank reports meanwhile is a DistributedError quoting it.
  void check_same(const std::string& what, const std::string& value);
  /// Waits for every rank, through the store: a rank that reported a failure (or whose
  /// heartbeat stops) ends the wait at once with a DistributedError naming it.
  void barrier();

  /// Called by a rank that fails on its own (an exception it is about to throw): the others'
  /// errors will quote it. Never throws.
  void report_failure(const std::string& message) noexcept;
  /// Records that this rank has reached `step` (DataParallel does, at each backward): a failure
  /// names the ranks that are behind.
  void mark_progress(std::int64_t step);
  /// Whether another rank has reported a failure (report_failure).
  bool any_failure_reported();
  /// What to say when a collective failed with `cause`: asks the store which ranks stopped
  /// answering (their heartbeat stopped) or reported an error, and returns the DistributedError
  /// naming them. Takes about two heartbeat intervals. The group is failed() from then on.
  DistributedError failure(const std::string& during, const std::exception& cause);
  /// Whether this rank found a failure (failure()) or reported its own (report_failure()): the
  /// group's collectives are then not to be used or waited for again.
  bool failed() const { return failed_; }
  /// Throws a DistributedError if the group failed(): broadcast, check_same, barrier,
  /// mark_progress and DataParallel's backward call it first, so that a failed group is not
  /// used again (as with torch.distributed: start a new job).
  void check_usable(const std::string& during) const;

 private:
  void start_heartbeat();
  // The store's `key`, from rank `from`: waited for while `from` is alive (`while_alive`), else
  // within the timeout. A reported failure, the store's loss, `from`'s silence for the timeout
  // or (not `while_alive`) the timeout is a DistributedError saying `during` what.
  std::string await(const std::string& key, int from, const std::string& during, bool while_alive);
  // Sets `key` in the store; the store's loss is a DistributedError.
  void publish(const std::string& key, const std::string& value, const std::string& during);
  // A new client of the store at env's address (for the heartbeat thread and the diagnosis).
  c10::intrusive_ptr<c10d::Store> connect(std::chrono::milliseconds timeout) const;

  c10::intrusive_ptr<c10d::Store> store_;
  Collectives collectives_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  std::optional<Environment> env_;
  std::int64_t calls_ = 0;  // broadcasts and checks so far: each one's keys are its own
  std::int64_t step_ = -1;  // the last mark_progress
  std::chrono::milliseconds heartbeat_interval_;
  std::atomic<bool> stop_{false};
  bool left_ = false;
  std::atomic<bool> failed_{false};
  std::vector<int> failed_ranks_;  // named by failure() or a wait (the caller's thread only)
  std::thread heartbeat_;
};

}  // namespace remat::distributed
