// One rank of the data-parallel tests (distributed_test.cpp starts them with launch_local):
// trains dp_network for --steps steps plainly and then checkpointed, each under DataParallel,
// and writes <out>/rank<R>.plain.pt, .checkpointed.pt (the final parameters), .peak (the
// checkpointed steps' largest measured peak and the budget) and, if it fails, .err. Also
// .initial.pt (the parameters and buffers once DataParallel has copied rank 0's) and .overlap
// (the buckets, and how many of them the last checkpointed step launched during its backward).
// The .pt files hold dp_state: the parameters, then the buffers. Times, in milliseconds of the
// machine's monotonic clock (steady_clock, the same in every process): a hanging victim writes
// .hang when it starts to hang; a rank that fails writes .times, when it caught the error and
// when its group was gone (left, and its backend shut down or abandoned).
// Rank --odd-rank R differs from the others: its network's hidden width is --odd-hidden H, or
// it believes the job has --odd-world N ranks.
//   remat_dp_worker --out DIR --steps K [--fail kill|hang|throw --victim R --at S]
//                   [--odd-rank R --odd-hidden H | --odd-world N] [--timeout-ms T]
//                   [--bucket-bytes B] [--zero-grad zero|none|optimizer] [--dp-first yes]
//                   [--backward dp|plain|no-sync] [--misuse second-dp|unfreeze]
// --dp-first yes: DataParallel is made before share_chain and solve (rank 0 then measures the
// chain with DataParallel's hooks on its parameters).
// --backward: how each step runs its backward: dp.backward(loss), the default; a plain
// loss.backward(), which DataParallel refuses; no-sync, the first half of the batch with
// loss.backward() under dp.no_sync(), then the second half with dp.backward().
// --fail before-chain|before-barrier (throws), hang-before-barrier (alive, never at the
// barrier), kill-before-barrier (SIGKILL), leave-before-barrier (returns 0, leaving the job).
// --fail store-thread: at step S, the victim's thread of its own throws std::system_error
// ("Connection reset by peer") and nothing catches it, as LibTorch 1.13's store thread does
// when rank 0 is killed; the group's terminate handler ends the process (exit
// --store-thread-exit-code C, default the group's 5; 0: no handler, SIGABRT).
// A rank's standard error goes to <out>/rank<R>.stderr (what a terminate handler prints).
// --misuse: makes a second DataParallel on the module (refused), or one on a frozen module
// whose parameter is then unfrozen (refused at its backward).
// --zero-grad: how each step clears the gradients (zero_() on each, the default; set to None
// by Module::zero_grad(true); the optimizer's zero_grad()).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <system_error>
#include <thread>

#include "dp_model.h"
#include "remat/distributed.h"
#include "remat/profiler/memory_tracker.h"
#include "remat/runtime.h"

namespace {

struct Args {
  std::string out;
  int steps = 3;
  std::string fail;
  int victim = -1, at = -1;
  int odd_rank = -1, odd_hidden = 32, odd_world = 0;
  std::string zero_grad = "zero";  // how each step clears the gradients: zero, none, optimizer
  bool dp_first = false;           // DataParallel made before share_chain and solve
  std::string backward = "dp";     // dp; plain (loss.backward()); no-sync (see above)
  std::string misuse;              // second-dp, unfreeze (see above)
  int timeout_ms = 20000;
  std::int64_t bucket_bytes = std::int64_t{25} << 20;
  int store_thread_exit_code = 5;
};

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string now_ms() {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace remat;
  using namespace remat::distributed;
  Args a;
  for (int k = 1; k + 1 < argc; k += 2) {
    const std::string flag = argv[k], value = argv[k + 1];
    if (flag == "--out") a.out = value;
    else if (flag == "--steps") a.steps = std::stoi(value);
    else if (flag == "--fail") a.fail = value;
    else if (flag == "--victim") a.victim = std::stoi(value);
    else if (flag == "--at") a.at = std::stoi(value);
    else if (flag == "--odd-rank") a.odd_rank = std::stoi(value);
    else if (flag == "--odd-hidden") a.odd_hidden = std::stoi(value);
    else if (flag == "--odd-world")
      a.odd_world = std::stoi(value);
    else if (flag == "--zero-grad")
      a.zero_grad = value;
    else if (flag == "--timeout-ms") a.timeout_ms = std::stoi(value);
    else if (flag == "--dp-first")
      a.dp_first = value == "yes";
    else if (flag == "--backward")
      a.backward = value;
    else if (flag == "--misuse")
      a.misuse = value;
    else if (flag == "--bucket-bytes")
      a.bucket_bytes = std::stoll(value);
    else if (flag == "--store-thread-exit-code")
      a.store_thread_exit_code = std::stoi(value);
  }
  if (const char* rank_text = std::getenv("RANK"); rank_text != nullptr && !a.out.empty())
    if (std::freopen((a.out + "/rank" + rank_text + ".stderr").c_str(), "w", stderr) != nullptr)
      std::setvbuf(stderr, nullptr, _IONBF, 0);
  int rank = -1;
  std::shared_ptr<Group> group;
  try {
    MemoryTracker& tracker = MemoryTracker::for_device(torch::kCPU);
    Environment env = Environment::from_env();
    rank = env.rank;
    if (rank == a.odd_rank && a.odd_world > 0) env.world_size = a.odd_world;
    torch::set_num_threads(1);
    group = Group::create(env, torch::kCPU,
                          GroupOptions()
                              .timeout(std::chrono::milliseconds(a.timeout_ms))
                              .startup_timeout(std::chrono::seconds(120))
                              .store_thread_exit_code(a.store_thread_exit_code));
    const std::string prefix = a.out + "/rank" + std::to_string(rank);
    const int hidden = rank == a.odd_rank ? a.odd_hidden : 32;
    std::int64_t worst_peak = 0, budget = 0;
    std::string overlap;
    for (const bool checkpointed : {false, true}) {
      torch::nn::Sequential net = test::dp_network(1234 + static_cast<std::uint64_t>(rank), hidden);
      if (a.zero_grad == "zero")
        for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
      Checkpointable chk(net);
      std::shared_ptr<torch::nn::Module> module = net.ptr();
      if (checkpointed) module = chk.ptr();
      std::unique_ptr<DataParallel> early;
      if (a.dp_first)
        early = std::make_unique<DataParallel>(module, group,
                                               DataParallelOptions().bucket_bytes(a.bucket_bytes));
      if (checkpointed) {
        const auto [sample, target] = test::dp_batch(rank, 0);
        if (rank == a.victim && a.fail == "before-chain")
          throw std::runtime_error("the victim failed on purpose before the chain");
        share_chain(*chk, *group, {sample}, {}, ProfileOptions().repeat(1));
        // A third of the way from the least budget to store-all: some stages are recomputed.
        budget = chk->min_budget() + (chk->store_all_peak() - chk->min_budget()) / 3;
        const Solution& s = solve(*chk, *group, SolveOptions(budget));
        if (!s.ok()) throw std::runtime_error("infeasible budget");
      }
      std::unique_ptr<DataParallel> late;
      if (!early)
        late = std::make_unique<DataParallel>(module, group,
                                              DataParallelOptions().bucket_bytes(a.bucket_bytes));
      DataParallel& dp = early ? *early : *late;
      if (a.misuse == "second-dp") DataParallel second(module, group);
      if (a.misuse == "unfreeze") {
        for (auto& p : net->parameters()) p.requires_grad_(false);
        DataParallel frozen(module, group);  // trains nothing
        net->parameters().front().requires_grad_(true);
        const auto [x, y] = test::dp_batch(rank, 0);
        frozen.backward(test::dp_loss(net->forward(x), y));
      }
      if (!checkpointed) torch::save(test::dp_state(*net), prefix + ".initial.pt");
      torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(test::kDpLearningRate));
      for (int step = 0; step < a.steps; ++step) {
        if (rank == a.victim && step == a.at && checkpointed) {
          if (a.fail == "kill") ::raise(SIGKILL);
          if (a.fail == "hang") {
            write(prefix + ".hang", now_ms() + "\n");
            for (;;) ::pause();
          }
          if (a.fail == "throw") throw std::runtime_error("the victim's step failed on purpose");
          if (a.fail == "store-thread") {
            std::thread([] {
              throw std::system_error(ECONNRESET, std::generic_category());
            }).detach();
            for (;;) ::pause();  // the process ends in that thread
          }
        }
        if (a.zero_grad == "none")
          net->zero_grad(true);  // every gradient None, as LibTorch 2.x's default does
        else if (a.zero_grad == "optimizer")
          sgd.zero_grad();  // detaches each gradient in place first
        else
          for (auto& p : net->parameters()) p.mutable_grad().zero_();
        const auto [x, y] = test::dp_batch(rank, step);
        const PeakScope scope(tracker);
        const auto loss_of = [&](const torch::Tensor& input, const torch::Tensor& target) {
          return test::dp_loss(checkpointed ? chk->forward(input) : net->forward(input), target);
        };
        if (a.backward == "plain") {
          loss_of(x, y).backward();
        } else if (a.backward == "no-sync") {
          const std::int64_t half = x.size(0) / 2;
          {
            auto local = dp.no_sync();
            loss_of(x.narrow(0, 0, half), y.narrow(0, 0, half)).backward();
          }
          dp.backward(loss_of(x.narrow(0, half, half), y.narrow(0, half, half)));
        } else {
          dp.backward(loss_of(x, y));
        }
        if (checkpointed) worst_peak = std::max(worst_peak, scope.peak_above_start());
        sgd.step();
      }
      if (checkpointed)
        overlap = std::to_string(dp.bucket_bytes().size()) + " " +
                  std::to_string(dp.last_step().overlapped_buckets) + "\n";
      torch::save(test::dp_state(*net), prefix + (checkpointed ? ".checkpointed.pt" : ".plain.pt"));
    }
    write(prefix + ".peak", std::to_string(worst_peak) + " " + std::to_string(budget) + "\n");
    write(prefix + ".overlap", overlap);
    if (rank == a.victim && a.fail == "before-barrier")
      throw std::runtime_error("the victim failed on purpose after its steps");
    if (rank == a.victim && a.fail == "hang-before-barrier")
      for (;;) ::pause();  // alive (its heartbeat goes on), never at the barrier
    if (rank == a.victim && a.fail == "kill-before-barrier") ::raise(SIGKILL);
    if (rank == a.victim && a.fail == "leave-before-barrier") return 0;  // leaves the job
    group->barrier();  // rank 0 hosts the store: it stays until every rank is done
    return 0;
  } catch (const std::exception& error) {
    const std::string caught = now_ms();
    const std::string message = message_of(error);
    if (group) group->report_failure(message);
    const std::string prefix = a.out + "/rank" + std::to_string(rank);
    if (rank >= 0 && !a.out.empty()) write(prefix + ".err", message);
    group.reset();
    if (rank >= 0 && !a.out.empty()) write(prefix + ".times", caught + " " + now_ms() + "\n");
    std::cerr << "rank " << rank << ": " << message << "\n";
    if (dynamic_cast<const DistributedError*>(&error) != nullptr) return 5;
    if (dynamic_cast<const c10::ValueError*>(&error) != nullptr) return 2;
    return 1;
  }
}
