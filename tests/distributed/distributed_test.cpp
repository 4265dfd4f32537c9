// Data-parallel training over c10d's Gloo on loopback, with 2 and 3 processes (dp_worker.cpp),
// against a single process that averages the same per-rank gradients; and how a job fails.
#include "remat/distributed.h"

#include <dirent.h>
#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "dp_model.h"
#include "test_paths.h"
#include "remat/runtime.h"

namespace {

namespace fs = std::filesystem;
using remat::distributed::RankExit;

// A job's folder holds files only. (POSIX calls: pip's libtorch.so carries its own
// std::filesystem::remove_all, which crashes when called from here.)
void remove_tree(const fs::path& path) {
  if (DIR* dir = ::opendir(path.c_str())) {
    while (const dirent* entry = ::readdir(dir))
      if (std::string(entry->d_name) != "." && std::string(entry->d_name) != "..")
        ::unlink((path / entry->d_name).c_str());
    ::closedir(dir);
  }
  ::rmdir(path.c_str());
}

struct Job {
  fs::path dir;
  std::vector<RankExit> exits;
  double seconds = 0;

  // What rank `rank` caught (.err), then all it printed on its standard error (.stderr).
  std::string error(int rank) const {
    std::stringstream text;
    for (const char* kind : {".err", ".stderr"}) {
      std::ifstream in(dir / ("rank" + std::to_string(rank) + kind));
      if (in) text << in.rdbuf() << "\n";
    }
    return text.str();
  }
  std::vector<torch::Tensor> parameters(int rank, const std::string& kind) const {
    std::vector<torch::Tensor> out;
    torch::load(out, (dir / ("rank" + std::to_string(rank) + "." + kind + ".pt")).string());
    return out;
  }
};

// Runs `world` workers with `args`; a rendezvous port that another process took meanwhile
// (rank 0 cannot host it) is retried with another.
Job run_job(int world, std::vector<std::string> args, const std::string& name,
            std::chrono::milliseconds grace = std::chrono::seconds(60)) {
  Job job;
  job.dir = fs::temp_directory_path() / ("remat-dp-" + name + "-" + std::to_string(::getpid()));
  for (int attempt = 0; attempt < 3; ++attempt) {
    remove_tree(job.dir);
    std::error_code ignored;
    fs::create_directories(job.dir, ignored);
    std::vector<std::string> argv{remat::test_paths::dp_worker, "--out", job.dir.string()};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto start = std::chrono::steady_clock::now();
    job.exits = remat::distributed::launch_local(
        argv, world,
        remat::distributed::LaunchOptions()
            .master("127.0.0.1", remat::distributed::free_local_port())
            .grace(grace));
    job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (job.error(0).find("cannot host the rendezvous") == std::string::npos) break;
  }
  return job;
}

// The single-process reference: rank 0's initial weights and buffers, and at each step the
// mean of the ranks' gradients (summed in rank order), applied by the same SGD; the buffers
// (BatchNorm's running statistics) are rank 0's, which DataParallel copies to every rank after
// each backward. Returns dp_state: the parameters, then the buffers. With `halves`, each rank's
// gradient is accumulated over two backwards, on the halves of its batch (dp_worker's
// --backward no-sync).
std::vector<torch::Tensor> reference(int world, int steps, bool halves = false) {
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);  // as the workers: the same kernels' summation order
  torch::nn::Sequential net = remat::test::dp_network(1234);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(remat::test::kDpLearningRate));
  const auto buffers = net->buffers();
  const auto set_buffers = [&](const std::vector<torch::Tensor>& values) {
    torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < buffers.size(); ++k) buffers[k].copy_(values[k]);
  };
  const auto buffer_values = [&] {
    std::vector<torch::Tensor> out;
    for (const auto& b : buffers) out.push_back(b.detach().clone());
    return out;
  };
  for (int step = 0; step < steps; ++step) {
    const std::vector<torch::Tensor> before = buffer_values();
    std::vector<torch::Tensor> rank0_after;
    std::vector<torch::Tensor> sum;
    for (int r = 0; r < world; ++r) {
      set_buffers(before);  // each rank's forward starts from the same statistics
      for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
      const auto [x, y] = remat::test::dp_batch(r, step);
      if (halves) {
        const std::int64_t half = x.size(0) / 2;
        for (const std::int64_t start : {std::int64_t{0}, half})
          remat::test::dp_loss(net->forward(x.narrow(0, start, half)), y.narrow(0, start, half))
              .backward();
      } else {
        remat::test::dp_loss(net->forward(x), y).backward();
      }
      if (r == 0) rank0_after = buffer_values();
      const auto params = net->parameters();
      for (std::size_t k = 0; k < params.size(); ++k) {
        if (r == 0)
          sum.push_back(params[k].grad().clone());
        else
          sum[k] += params[k].grad();
      }
    }
    set_buffers(rank0_after);
    const auto params = net->parameters();
    for (std::size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = sum[k] / world;
    sgd.step();
  }
  torch::set_num_threads(threads);
  return remat::test::dp_state(*net);
}

double largest_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k)
    worst = std::max(worst, ((a[k].to(torch::kDouble) - b[k].to(torch::kDouble)).abs().max() /
                             b[k].to(torch::kDouble).abs().max())
                                .item<double>());
  return worst;
}

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (!torch::equal(a[k], b[k])) return false;
  return true;
}

// A collective of a stand-in process group, done when it is launched.
class DoneWork : public c10d::Work {
 public:
  DoneWork() : future_(c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get())) {
    future_->markCompleted(c10::IValue());
  }
  bool isCompleted() override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

TEST_CASE("data-parallel training on Gloo equals one process averaging the ranks' gradients",
          "[distributed]") {
  const int world = GENERATE(2, 3);
  const int steps = 4;
  CAPTURE(world);
  // Buckets of at most 4 KiB: about one per layer, so that they are launched one by one as the
  // backward finishes each stage, the tied weight's last (it is ready only when its second
  // gradient, from stage 0, has come).
  const Job job = run_job(world, {"--steps", std::to_string(steps), "--bucket-bytes", "4096"},
                          "train" + std::to_string(world));
  for (const RankExit& e : job.exits) {
    INFO("rank " << e.rank << ": " << job.error(e.rank));
    REQUIRE(e.code == 0);
  }
  // Once DataParallel is made, every rank has rank 0's parameters and buffers (each started
  // from its own).
  const std::vector<torch::Tensor> initial = remat::test::dp_state(*remat::test::dp_network(1234));
  const std::vector<torch::Tensor> expected = reference(world, steps);
  const std::vector<torch::Tensor> rank0 = job.parameters(0, "plain");
  REQUIRE(rank0.size() == expected.size());
  // Two ranks: a + b is b + a, so the all-reduce's sum is the reference's to the bit. Three: Gloo
  // adds the ranks' gradients in another order than (g0 + g1) + g2, which may differ by an ulp
  // of each sum; 4 SGD steps of lr 0.1 keep the parameters (and the statistics rank 0's batches
  // give them) within a few ulps (1e-6 relative).
  if (world == 2)
    CHECK(all_equal(rank0, expected));
  else
    CHECK(largest_relative_difference(rank0, expected) < 1e-6);
  CHECK(largest_relative_difference(rank0, expected) < 1e-6);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(all_equal(job.parameters(r, "initial"), initial));
    // Every rank has the same parameters and buffers, and checkpointed training gives those of
    // plain training, to the bit (BatchNorm's statistics updated once per step).
    CHECK(all_equal(job.parameters(r, "plain"), rank0));
    CHECK(all_equal(job.parameters(r, "checkpointed"), rank0));
    // The measured peak of each checkpointed step stays within the rank's budget.
    std::ifstream peak_file(job.dir / ("rank" + std::to_string(r) + ".peak"));
    std::int64_t peak = -1, budget = -1;
    peak_file >> peak >> budget;
    CHECK(peak > 0);
    CHECK(budget > 0);
    CHECK(peak <= budget);
    // After the first step, every bucket is launched during the backward (from the hook of its
    // last gradient), not after it.
    std::ifstream overlap_file(job.dir / ("rank" + std::to_string(r) + ".overlap"));
    int buckets = -1, overlapped = -1;
    overlap_file >> buckets >> overlapped;
    CHECK(buckets >= 5);
    CHECK(overlapped == buckets);
  }
  remove_tree(job.dir);
}

TEST_CASE("gradients cleared by zero_grad, to None or by an optimizer, are still averaged",
          "[distributed]") {
  // A user's trial: Module::zero_grad() (None) before the first step left each rank its own
  // gradient, without a word; an optimizer's zero_grad() threw (it detaches the gradient in
  // place, which LibTorch refuses for a view of the bucket). Also with DataParallel made before
  // the chain is measured (its hooks then see rank 0's profiling backwards).
  const std::string mode = GENERATE(std::string("none"), std::string("optimizer"));
  const std::string dp_first = GENERATE(std::string("no"), std::string("yes"));
  CAPTURE(mode, dp_first);
  const int steps = 3;
  const Job job =
      run_job(2, {"--steps", std::to_string(steps), "--zero-grad", mode, "--dp-first", dp_first},
              "zero-" + mode + "-" + dp_first);
  for (const RankExit& e : job.exits) {
    INFO("rank " << e.rank << ": " << job.error(e.rank));
    REQUIRE(e.code == 0);
  }
  const std::vector<torch::Tensor> expected = reference(2, steps);
  for (int r : {0, 1})
    for (const char* kind : {"plain", "checkpointed"}) {
      CAPTURE(r, kind);
      CHECK(all_equal(job.parameters(r, kind), expected));
    }
  remove_tree(job.dir);
}

TEST_CASE("under no_sync, gradients accumulate locally and the next backward averages them",
          "[distributed]") {
  // DDP's no_sync(): gradient accumulation over micro-batches, one all-reduce per step.
  const int steps = 3;
  const Job job =
      run_job(2, {"--steps", std::to_string(steps), "--backward", "no-sync"}, "no-sync");
  for (const RankExit& e : job.exits) {
    INFO("rank " << e.rank << ": " << job.error(e.rank));
    REQUIRE(e.code == 0);
  }
  const std::vector<torch::Tensor> expected = reference(2, steps, /*halves=*/true);
  CHECK_FALSE(all_equal(expected, reference(2, steps)));  // the halves make a difference
  // Checkpointed, the tied weight's two gradients of a backward reach its .grad one by one,
  // from two stages' backwards ((g + a) + b), where plain autograd adds them first (g + (a + b)):
  // with g, the first half's gradient, not zero, the sums may differ by an ulp
  // (docs/distributed.md), within 1e-6 relative after 3 steps.
  for (int r : {0, 1}) {
    CAPTURE(r);
    CHECK(all_equal(job.parameters(r, "plain"), expected));
    CHECK(largest_relative_difference(job.parameters(r, "checkpointed"), expected) < 1e-6);
    CHECK(all_equal(job.parameters(r, "checkpointed"), job.parameters(0, "checkpointed")));
  }
  remove_tree(job.dir);
}

TEST_CASE("what would make the ranks train different models without a word is refused",
          "[distributed]") {
  // A user's trial: each of these trained on, the ranks' models drifting apart.
  struct Misuse {
    std::vector<std::string> args;
    std::string message;
  };
  const auto [args, message] = GENERATE(
      Misuse{{"--backward", "plain"},
             "DataParallel: parameter 9.bias received a gradient from a backward outside "
             "DataParallel::backward() (loss.backward()?), which would not be averaged over the "
             "ranks"},
      Misuse{{"--misuse", "second-dp"},
             "DataParallel: parameter 0.weight is already trained by another DataParallel, "
             "which still exists"},
      Misuse{{"--misuse", "unfreeze"},
             "DataParallel: parameter 0.weight requires grad but did not when the DataParallel "
             "was made (unfrozen since, or new)"});
  CAPTURE(args);
  std::vector<std::string> all{"--steps", "2"};
  all.insert(all.end(), args.begin(), args.end());
  const Job job = run_job(2, all, "misuse-" + args.back());
  for (const RankExit& e : job.exits) {
    CAPTURE(e.rank);
    CHECK(e.code == 2);  // an InputError
    CHECK_THAT(job.error(e.rank), Catch::StartsWith(message));
  }
  remove_tree(job.dir);
}

TEST_CASE("DataParallel launches a bucket's all-reduce once all its gradients are complete",
          "[distributed]") {
  // One rank, on a stand-in process group whose all-reduce records what the bucket held when it
  // was launched. Nothing may change a bucket after its launch: an all-reduce launched before
  // its last gradient came (the tied weight's second, from stage 0) would send an incomplete
  // sum, which over Gloo shows only when the backend thread wins the race.
  struct Launch {
    torch::Tensor bucket, held;
  };
  auto launches = std::make_shared<std::vector<Launch>>();
  remat::distributed::Collectives stand_in;
  stand_in.allreduce =
      [launches](std::vector<at::Tensor>& tensors) -> c10::intrusive_ptr<c10d::Work> {
    launches->push_back({tensors[0], tensors[0].clone()});
    return c10::make_intrusive<DoneWork>();
  };
  stand_in.broadcast = [](std::vector<at::Tensor>&, int) -> c10::intrusive_ptr<c10d::Work> {
    return c10::make_intrusive<DoneWork>();
  };
  stand_in.barrier = []() -> c10::intrusive_ptr<c10d::Work> {
    return c10::make_intrusive<DoneWork>();
  };
  auto group = std::make_shared<remat::distributed::Group>(c10::make_intrusive<c10d::HashStore>(),
                                                           stand_in, std::chrono::seconds(10));
  const bool checkpointed = GENERATE(false, true);
  CAPTURE(checkpointed);
  torch::nn::Sequential net = remat::test::dp_network(1234);
  torch::nn::Sequential plain = remat::test::dp_network(1234);  // the reference: plain autograd
  remat::Checkpointable chk(net);
  std::shared_ptr<torch::nn::Module> module = net.ptr();
  if (checkpointed) {
    chk->measure({remat::test::dp_batch(0, 0).first}, {}, remat::ProfileOptions().repeat(1));
    const std::int64_t budget = chk->min_budget() + (chk->store_all_peak() - chk->min_budget()) / 3;
    REQUIRE(chk->compute_sequence(remat::SolveOptions(budget)).ok());
    module = chk.ptr();
  }
  for (auto* m : {&net, &plain})
    for (auto& p : (*m)->parameters()) p.mutable_grad() = torch::zeros_like(p);
  remat::distributed::DataParallel dp(module, group,
                                      remat::distributed::DataParallelOptions().bucket_bytes(4096));
  const std::size_t buckets = dp.bucket_bytes().size();
  CHECK(buckets == 7);
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    for (auto* m : {&net, &plain})
      for (auto& p : (*m)->parameters()) p.mutable_grad().zero_();
    const auto [x, y] = remat::test::dp_batch(0, step);
    launches->clear();
    dp.backward(remat::test::dp_loss(checkpointed ? chk->forward(x) : net->forward(x), y));
    remat::test::dp_loss(plain->forward(x), y).backward();
    REQUIRE(launches->size() == buckets);
    for (std::size_t b = 0; b < buckets; ++b) {
      CAPTURE(b);
      CHECK(torch::equal((*launches)[b].held, (*launches)[b].bucket));
    }
    // The first step learns how many gradients each parameter gets, and launches after the
    // backward; then every bucket is launched during it.
    CHECK(dp.last_step().overlapped_buckets == (step == 0 ? 0 : static_cast<int>(buckets)));
    // The gradients are plain autograd's, the tied weight's sum of two included.
    const auto ours = net->parameters(), theirs = plain->parameters();
    for (std::size_t k = 0; k < ours.size(); ++k) {
      CAPTURE(k);
      CHECK(torch::equal(ours[k].grad(), theirs[k].grad()));
    }
    torch::NoGradGuard no_grad;
    for (auto* m : {&net, &plain})
      for (auto& p : (*m)->parameters()) p -= remat::test::kDpLearningRate * p.grad();
  }
  CHECK(all_equal(remat::test::dp_state(*net), remat::test::dp_state(*plain)));
}

TEST_CASE("a killed rank makes the others stop with an error naming it", "[distributed]") {
  // Rank 1, or rank 0, which hosts the rendezvous store: the store goes with it.
  const int victim = GENERATE(1, 0);
  CAPTURE(victim);
  const int timeout_ms = 30000;
  const Job job =
      run_job(3, {"--steps", "3", "--fail", "kill", "--victim", std::to_string(victim), "--at",
                  "1", "--timeout-ms", std::to_string(timeout_ms)},
              "kill");
  CHECK(job.exits[static_cast<std::size_t>(victim)].code == 128 + 9);
  for (int r : {0, 1, 2}) {
    if (r == victim) continue;
    CAPTURE(r, job.error(r));
    CHECK(job.exits[static_cast<std::size_t>(r)].code == 5);
    CHECK_FALSE(job.exits[static_cast<std::size_t>(r)].killed_by_launcher);
    CHECK(job.error(r).find(fmt::format("rank {} stopped answering", victim)) !=
          std::string::npos);
  }
  // Noticed when the connections closed, long before the timeout.
  CHECK(job.seconds < timeout_ms / 1000.0);
  remove_tree(job.dir);
}

TEST_CASE("an error escaping LibTorch's store thread on a rank is rank 0 lost, exit 5",
          "[distributed]") {
  // LibTorch 1.13's store thread lets the error of a connection to rank 0's store that was
  // reset escape (rank 0 killed): Group's terminate handler reports it as rank 0 lost, rather
  // than the rank dying of SIGABRT. Rank 1's own thread throws the same way here.
  const Job job = run_job(2, {"--steps", "3", "--fail", "store-thread", "--victim", "1", "--at", "1"},
                          "store-thread");
  CAPTURE(job.error(0), job.error(1));
  CHECK(job.exits[1].code == 5);
  CHECK(job.error(1).find("remat: rank 1: rank 0 stopped answering (the connection to the "
                          "rendezvous store it hosts at 127.0.0.1:") != std::string::npos);
  CHECK(job.error(1).find("LibTorch's store thread said: ") != std::string::npos);
  CHECK(job.error(1).find("terminate called") == std::string::npos);
  // Then rank 0 names rank 1, whose heartbeat stopped with it.
  CHECK(job.exits[0].code == 5);
  CHECK(job.error(0).find("rank 1 stopped answering") != std::string::npos);
  remove_tree(job.dir);

  // Without the handler (GroupOptions::store_thread_exit_code(0)), LibTorch's way: SIGABRT.
  const Job plain = run_job(2,
                            {"--steps", "3", "--fail", "store-thread", "--victim", "1", "--at", "1",
                             "--store-thread-exit-code", "0"},
                            "store-thread-0");
  CAPTURE(plain.error(1));
  CHECK(plain.exits[1].code == 128 + SIGABRT);
  CHECK(plain.error(1).find("rank 0 stopped answering") == std::string::npos);
  remove_tree(plain.dir);
}

TEST_CASE("a hung rank makes the others stop within the timeout, naming it", "[distributed]") {
  const int timeout_ms = 5000;
  // Small buckets: several all-reduces are left waiting for the hung rank.
  const Job job = run_job(2,
                          {"--steps", "3", "--fail", "hang", "--victim", "1", "--at", "1",
                           "--timeout-ms", std::to_string(timeout_ms), "--bucket-bytes", "4096"},
                          "hang", std::chrono::milliseconds(2000));
  CAPTURE(job.error(0), job.seconds);
  CHECK(job.exits[0].code == 5);
  CHECK(job.error(0).find("rank 1 is behind") != std::string::npos);
  CHECK(job.exits[1].killed_by_launcher);
  // Rank 0 catches the error the timeout after rank 1 began to hang, plus its diagnosis (two
  // heartbeat intervals, 1.1 s); then its group is gone at once. Waiting for the lost
  // all-reduces in DataParallel's destructor or in the backend's, or for the hung rank in
  // leave(), would each take another timeout or more. (Times on the monotonic clock that all
  // processes share, so that the machine's load before the hang does not count.)
  std::int64_t hang = -1, caught = -1, gone = -1;
  std::ifstream(job.dir / "rank1.hang") >> hang;
  std::ifstream(job.dir / "rank0.times") >> caught >> gone;
  CAPTURE(hang, caught, gone);
  REQUIRE(hang > 0);
  REQUIRE(caught > 0);
  // Not declared hung early (rank 0's last all-reduce may have begun a little before rank 1
  // hung), nor late: 6.1 s and 10 ms on the 2-core machine.
  CHECK(caught - hang > timeout_ms / 2);
  CHECK(caught - hang < timeout_ms + 4000);
  CHECK(gone - caught < 2000);
  // Within the timeout, not the start-up timeout (120 s, which the workers give the rendezvous
  // and, on LibTorch 1.13, Gloo gives its collectives).
  CHECK(job.seconds < 60);
  remove_tree(job.dir);
}

TEST_CASE("a rank that fails is named by the others", "[distributed]") {
  const Job job = run_job(2, {"--steps", "3", "--fail", "throw", "--victim", "1", "--at", "1"}, "throw");
  CAPTURE(job.error(0), job.error(1));
  CHECK(job.exits[1].code == 1);
  CHECK(job.exits[0].code == 5);
  CHECK(job.error(0).find("rank 1 failed: the victim's step failed on purpose") != std::string::npos);
  remove_tree(job.dir);
}

TEST_CASE("a rank that fails outside a collective stops the others at once, quoting it",
          "[distributed]") {
  // Rank 0 (which hosts the store) fails before it shares its chain (a --chain it cannot
  // read), or after its steps, before the final barrier (a peak above the budget): the others
  // wait in the store, not in a collective, and must not wait out the timeout.
  const int timeout_ms = 60000;
  for (const std::string when : {"before-chain", "before-barrier"}) {
    DYNAMIC_SECTION(when) {
      const Job job = run_job(2,
                              {"--steps", "2", "--fail", when, "--victim", "0", "--timeout-ms",
                               std::to_string(timeout_ms)},
                              when);
      CAPTURE(job.error(0), job.error(1), job.seconds);
      CHECK(job.exits[0].code == 1);
      CHECK(job.exits[1].code == 5);
      CHECK(job.error(1).find("rank 0 failed: the victim failed on purpose") != std::string::npos);
      CHECK(job.seconds < timeout_ms / 1000.0);
      remove_tree(job.dir);
    }
  }
}

TEST_CASE("a rank killed or gone outside a collective is named long before the timeout",
          "[distributed]") {
  // Rank 1 is killed after its steps (the kernel's OOM killer), or leaves without the final
  // barrier (a program that returns early): rank 0 waits in the store, where no connection
  // closes. Killed: its heartbeat stops, and 10 beats (10 s with this timeout) name it; it
  // waited the whole timeout (60 s, 5 minutes by default) before. Gone: named at once.
  const int timeout_ms = 60000;
  for (const std::string when : {"kill-before-barrier", "leave-before-barrier"}) {
    DYNAMIC_SECTION(when) {
      const Job job = run_job(2,
                              {"--steps", "1", "--fail", when, "--victim", "1", "--timeout-ms",
                               std::to_string(timeout_ms)},
                              when, std::chrono::milliseconds(timeout_ms + 30000));
      CAPTURE(job.error(0), job.seconds);
      CHECK(job.exits[0].code == 5);
      CHECK_FALSE(job.exits[0].killed_by_launcher);
      CHECK(job.error(0).find(when == "kill-before-barrier"
                                  ? "a barrier: rank 1 stopped answering (its heartbeat stopped"
                                  : "a barrier: rank 1 left the job without getting here") !=
            std::string::npos);
      CHECK(job.seconds < timeout_ms / 1000.0 * 0.75);
      remove_tree(job.dir);
    }
  }
}

TEST_CASE("a rank alive but elsewhere does not hold the others past the timeout", "[distributed]") {
  // Rank 1 hangs after its steps, its heartbeat still going: rank 0 waits at the final barrier
  // for the timeout, not for as long as rank 1 lives.
  const int timeout_ms = 3000;
  const Job job = run_job(2,
                          {"--steps", "1", "--fail", "hang-before-barrier", "--victim", "1",
                           "--timeout-ms", std::to_string(timeout_ms)},
                          "elsewhere", std::chrono::milliseconds(2000));
  CAPTURE(job.error(0), job.seconds);
  CHECK(job.exits[0].code == 5);
  CHECK(job.error(0).find("a barrier: rank 1 did not get there within 3000 ms (it is running") !=
        std::string::npos);
  CHECK(job.exits[1].killed_by_launcher);
  // Rank 0 does not wait again, as it leaves, for the rank it named (it waited a second
  // timeout for it, whose heartbeat goes on).
  std::int64_t caught = 0, gone = 0;
  std::ifstream(job.dir / "rank0.times") >> caught >> gone;
  CHECK(caught > 0);
  CHECK(gone - caught < 1500);
  remove_tree(job.dir);
}

TEST_CASE("ranks with different models are refused at start-up", "[distributed]") {
  const Job job = run_job(2, {"--steps", "1", "--odd-rank", "1", "--odd-hidden", "33"}, "mismatch");
  for (int r : {0, 1}) {
    CAPTURE(r, job.error(r));
    CHECK(job.exits[static_cast<std::size_t>(r)].code == 2);
    CHECK(job.error(r).find("differs between ranks: rank 1 differs from rank 0; at line 1, rank 1 "
                            "has 'parameter 0.weight float [33, 16]' where rank 0 has 'parameter "
                            "0.weight float [32, 16]'") != std::string::npos);
  }
  remove_tree(job.dir);
}

TEST_CASE("ranks started for jobs of different sizes are refused at start-up", "[distributed]") {
  // Rank 1 believes in 3 ranks, rank 0 in 2: both say so (exit 2), rather than rank 1 waiting
  // for a rank 2 that never comes and rank 0 for a collective.
  const Job job = run_job(2, {"--steps", "1", "--odd-rank", "1", "--odd-world", "3"}, "sizes");
  for (int r : {0, 1}) {
    CAPTURE(r, job.error(r));
    CHECK(job.exits[static_cast<std::size_t>(r)].code == 2);
    CHECK(job.error(r).find(fmt::format("rank {}: the ranks were started for jobs of different "
                                        "sizes (rank 0 for 2, rank 1 for 3 ranks)",
                                        r)) != std::string::npos);
  }
  CHECK(job.seconds < 30);
  remove_tree(job.dir);
}

namespace {

// A store that makes a race between two ranks certain: the first time this rank checks for
// `key`, the other rank's `writes` land, between that check and the next. The check itself
// answers as the store stood just before the writes when `answer_before` is true (the other
// rank was a moment late), and after them otherwise.
struct RacingStore : c10d::HashStore {
  RacingStore(std::string key_, std::vector<std::pair<std::string, std::string>> writes_,
              bool answer_before_)
      : key(std::move(key_)), writes(std::move(writes_)), answer_before(answer_before_) {}
  bool check(const std::vector<std::string>& keys) override {
    if (raced || keys != std::vector<std::string>{key}) return c10d::HashStore::check(keys);
    raced = true;
    const bool before = c10d::HashStore::check(keys);
    for (const auto& [written, value] : writes)
      set(written, std::vector<std::uint8_t>(value.begin(), value.end()));
    return answer_before ? before : c10d::HashStore::check(keys);
  }
  std::string key;
  std::vector<std::pair<std::string, std::string>> writes;
  bool answer_before;
  bool raced = false;
};

// Rank 1 of a 2-rank job on `store`, with no process group behind it (only the store is used).
remat::distributed::Group rank_one_of_two(const c10::intrusive_ptr<RacingStore>& store) {
  remat::distributed::Collectives stand_in;
  stand_in.rank = 1;
  stand_in.size = 2;
  return remat::distributed::Group(store, stand_in, std::chrono::seconds(10));
}

}  // namespace

TEST_CASE(
    "a value published before a reported failure is still taken: every rank gives the same "
    "verdict",
    "[distributed]") {
  // check_same's race, made certain: rank 1 looks for rank 0's description and finds it missing;
  // then, before rank 1 looks for reported failures, rank 0 publishes it, finds that the ranks
  // differ and reports that. Rank 1 must refuse the model too (an InputError, exit 2), not stop
  // as if rank 0 were lost. (CI saw it on a loaded machine: exit 5 on rank 1.)
  auto store = c10::make_intrusive<RacingStore>(
      "remat/check/0/0",
      std::vector<std::pair<std::string, std::string>>{{"remat/check/0/0", "A\n"},
                                                       {"remat/error/0", "differ"}},
      /*answer_before=*/true);
  auto group = rank_one_of_two(store);
  try {
    group.check_same("the model", "B\n");
    FAIL("ranks that differ were accepted");
  } catch (const remat::distributed::DistributedError& error) {
    FAIL("rank 1 stopped as if rank 0 were lost: " << error.what());
  } catch (const remat::InputError& error) {
    CHECK(std::string(error.what())
              .find("the model differs between ranks: rank 1 differs from "
                    "rank 0; at line 1, rank 1 has 'B' where rank 0 has 'A'") != std::string::npos);
  }
  CHECK(store->raced);
}

TEST_CASE("a failure reported just before its rank leaves is taken, not that the rank left",
          "[distributed]") {
  // Rank 0 reports its failure, then leaves, both between rank 1's look for reported failures
  // and its look for ranks that left (seen once in a 2-rank job: rank 1 said that rank 0 left
  // without reporting an error, where the job's error was rank 0's own). Made certain here.
  auto store = c10::make_intrusive<RacingStore>(
      "remat/left/0",
      std::vector<std::pair<std::string, std::string>>{{"remat/error/0", "failed"},
                                                       {"remat/left/0", "1"}},
      /*answer_before=*/false);
  auto group = rank_one_of_two(store);
  try {
    group.check_same("the model", "A\n");
    FAIL("rank 1 went on without rank 0's value");
  } catch (const remat::distributed::DistributedError& error) {
    const std::string said = error.what();
    CAPTURE(said);
    CHECK(said.find("another rank reported a failure") != std::string::npos);
    CHECK(said.find("left the job") == std::string::npos);
  }
  CHECK(store->raced);
}

TEST_CASE("a failed group is not used again", "[distributed]") {
  // A user's trial: after a failure, the group's calls went on as if nothing had happened (a
  // barrier that rank 0 completed could then fail on rank 1).
  remat::distributed::Collectives stand_in;
  stand_in.allreduce = [](std::vector<at::Tensor>&) -> c10::intrusive_ptr<c10d::Work> {
    return c10::make_intrusive<DoneWork>();
  };
  stand_in.broadcast = [](std::vector<at::Tensor>&, int) -> c10::intrusive_ptr<c10d::Work> {
    return c10::make_intrusive<DoneWork>();
  };
  auto group = std::make_shared<remat::distributed::Group>(c10::make_intrusive<c10d::HashStore>(),
                                                           stand_in, std::chrono::seconds(10));
  torch::nn::Sequential net = remat::test::dp_network(1234);
  remat::distributed::DataParallel dp(net.ptr(), group);
  const auto [x, y] = remat::test::dp_batch(0, 0);
  dp.backward(remat::test::dp_loss(net->forward(x), y));  // a healthy step
  group->barrier();
  group->report_failure("this rank's data loader failed");
  const auto refused = Catch::Contains(
      "this group failed before (see the first error), and a "
      "failed group cannot be used again: start a new job");
  using remat::distributed::DistributedError;
  CHECK_THROWS_AS(group->barrier(), DistributedError);
  CHECK_THROWS_WITH(group->barrier(), refused);
  CHECK_THROWS_WITH(group->broadcast("the chain", "x"), refused);
  CHECK_THROWS_WITH(group->check_same("the model", "x"), refused);
  CHECK_THROWS_WITH(dp.backward(remat::test::dp_loss(net->forward(x), y)),
                    refused && Catch::Contains("starting step 2"));
}

TEST_CASE("a timeout shorter than a few heartbeats is refused", "[distributed]") {
  // Ranks beat every 50 ms at least: with 30 ms a healthy rank 0 was reported dead (a user's
  // trial).
  remat::distributed::Environment env;  // rank 0 of 1
  CHECK_THROWS_WITH(remat::distributed::Group::create(
                        env, torch::kCPU,
                        remat::distributed::GroupOptions().timeout(std::chrono::milliseconds(30))),
                    Catch::Contains("the timeout must be at least 200 ms"));
}

TEST_CASE("a large job whose ranks never join is refused within its start-up timeout, briefly",
          "[distributed]") {
  // Rank 0 of 65,536 (the most WORLD_SIZE allows), alone: asking the store for each missing
  // rank one by one took 45 s past a timeout of seconds, and the message listed them all
  // (7.9 MB). Past the deadline the others are missing without being asked, and consecutive
  // ranks read as a range.
  remat::distributed::Environment env;
  env.world_size = 65536;
  env.master_port = remat::distributed::free_local_port();
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    remat::distributed::Group::create(
        env, torch::kCPU,
        remat::distributed::GroupOptions().timeout(std::chrono::milliseconds(1000)));
  } catch (const remat::distributed::DistributedError& error) {
    message = error.what_without_backtrace();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CAPTURE(seconds, message.substr(0, 400));
  CHECK_THAT(message, Catch::StartsWith("ranks 1-65535 did not join the rendezvous at 127.0.0.1:"));
  CHECK_THAT(message, Catch::Contains("within 1000 ms"));
  CHECK(message.size() < 200);
  CHECK(seconds < 10);
}

TEST_CASE("torchrun's environment is read, and bad values are refused", "[distributed]") {
  using remat::distributed::Environment;
  struct Saved {
    std::vector<std::pair<std::string, std::optional<std::string>>> values;
    Saved() {
      for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
        const char* v = std::getenv(name);
        values.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
        ::unsetenv(name);
      }
    }
    ~Saved() {
      for (const auto& [name, v] : values)
        if (v) ::setenv(name.c_str(), v->c_str(), 1); else ::unsetenv(name.c_str());
    }
  } saved;
  CHECK_FALSE(Environment::in_env());
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  ::setenv("MASTER_PORT", "1234", 1);
  Environment env = Environment::from_env();
  CHECK(env.rank == 2);
  CHECK(env.world_size == 3);
  CHECK(env.local_rank == 2);
  CHECK(env.master_addr == "10.0.0.7");
  CHECK(env.master_port == 1234);
  const auto refused = [](const char* name, const char* value, const std::string& says) {
    const char* old = std::getenv(name);
    const std::optional<std::string> keep = old ? std::optional<std::string>(old) : std::nullopt;
    ::setenv(name, value, 1);
    CHECK_THROWS_WITH(Environment::from_env(), Catch::Contains(says));
    CHECK_THROWS_AS(Environment::from_env(), c10::ValueError);
    if (keep) ::setenv(name, keep->c_str(), 1); else ::unsetenv(name);
  };
  refused("RANK", "3", "RANK=3 is out of range: it must be from 0 to 2");
  refused("RANK", "one", "RANK='one' is not a whole number (from 0 to 2)");
  refused("WORLD_SIZE", "0", "WORLD_SIZE=0 is out of range");
  refused("MASTER_PORT", "70000", "MASTER_PORT=70000 is out of range: it must be from 1 to 65535");
  refused("MASTER_PORT", "99999999999999999999",
          "MASTER_PORT=99999999999999999999 is out of range");
  refused("LOCAL_RANK", "-1", "LOCAL_RANK=-1 is out of range");
  // What reaches the terminal is escaped and shortened.
  refused("RANK", "\x1b[2J1", "RANK='\\x1b[2J1' is not a whole number");
  refused("RANK", std::string(5000, '7').c_str(),
          "RANK=7777777777777777777777777777777777777777... (5000 bytes) is out of range");
  refused("MASTER_ADDR", "", "MASTER_ADDR is set but empty");
  refused("MASTER_PORT", "", "MASTER_PORT is set but empty");  // not 29500, silently
  ::unsetenv("WORLD_SIZE");
  CHECK_THROWS_WITH(Environment::from_env(), Catch::Contains("WORLD_SIZE is not set"));
  CHECK_THROWS_WITH(remat::distributed::parse_backend("mpi"), Catch::Contains("unknown backend 'mpi'"));
}
