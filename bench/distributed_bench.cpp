// Data-parallel training on Gloo (CPU): the step time of 1, 2 and 3 local ranks, each with the
// same per-rank batch, against one process without DataParallel; and the all-reduce's cost:
// how long it ran, how much of it the backward (recomputations included) hid, and how much was
// left after the backward (exposed). Every rank runs the same schedule (rank 0 profiles).
//
//   remat_distributed_bench --model resnet18 --batch 16 --image 64 --budget 60 --steps 12
//
// Without RANK in the environment it is the driver: it starts the ranks (launch_local, this
// same program) for each configuration and prints the table from what rank 0 wrote.
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "remat/distributed.h"
#include "remat/models.h"
#include "remat/profiler.h"
#include "remat/runtime.h"

namespace {

using Clock = std::chrono::steady_clock;
using remat::bench::median;

struct Args {
  std::string model = "resnet18";
  int batch = 16;
  int image = 64;
  int budget_percent = 60;
  int steps = 12;
  int threads = 1;
  std::vector<int> procs{1, 2, 3};
  std::string out;  // a rank: where rank 0 writes its figures
  bool plain = false;  // a rank: one process without DataParallel
};

// One rank: train, and (rank 0) write "step backward all_reduce hidden exposed overlapped".
int rank_main(const Args& a) {
  torch::set_num_threads(a.threads);
  const bool distributed = !a.plain;
  std::shared_ptr<remat::distributed::Group> group;
  int rank = 0;
  if (distributed) {
    const auto env = remat::distributed::Environment::from_env();
    rank = env.rank;
    group = remat::distributed::Group::create(env, torch::kCPU);
  }
  const auto& info = remat::models::find_model(a.model);
  torch::manual_seed(0);
  torch::nn::Sequential net = info.make(10);
  net->train();
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  torch::manual_seed(static_cast<std::uint64_t>(rank) + 1);
  const torch::Tensor x = torch::randn({a.batch, 3, a.image, a.image});
  const torch::Tensor y = torch::randint(10, {a.batch});
  remat::Checkpointable chk(net);
  const auto loss_of = [&](const torch::Tensor& out) { return torch::cross_entropy_loss(out, y); };
  if (group)
    remat::distributed::share_chain(*chk, *group, {x}, {}, remat::ProfileOptions().repeat(3));
  else
    chk->measure(x, remat::ProfileOptions().repeat(3));
  const std::int64_t budget = chk->store_all_peak() * a.budget_percent / 100;
  const remat::SolveOptions options(budget);
  const remat::Solution& s = group ? remat::distributed::solve(*chk, *group, options)
                                   : chk->compute_sequence(options);
  if (!s.ok()) {
    std::fprintf(stderr, "infeasible: %d%% of store-all\n", a.budget_percent);
    return 3;
  }
  std::unique_ptr<remat::distributed::DataParallel> dp;
  if (group) dp = std::make_unique<remat::distributed::DataParallel>(chk.ptr(), group);
  std::vector<double> step, backward, all_reduce, hidden, exposed, overlapped;
  for (int k = 0; k < a.steps + 2; ++k) {  // 2 warm-up steps (the first learns the buckets)
    for (auto& p : net->parameters()) p.mutable_grad().zero_();
    const auto start = Clock::now();
    torch::Tensor loss = loss_of(chk->forward(x));
    if (dp)
      dp->backward(loss);
    else
      loss.backward();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (k < 2) continue;
    step.push_back(ms);
    if (dp) {
      const auto& t = dp->last_step();
      backward.push_back(t.backward_ms);
      all_reduce.push_back(t.all_reduce_ms);
      hidden.push_back(t.hidden_ms);
      exposed.push_back(t.exposed_ms);
      overlapped.push_back(t.overlapped_buckets);
    }
  }
  if (group) group->barrier();
  if (rank == 0) {
    std::ofstream out(a.out);
    out << median(step) << ' ' << (dp ? median(backward) : 0) << ' ' << (dp ? median(all_reduce) : 0)
        << ' ' << (dp ? median(hidden) : 0) << ' ' << (dp ? median(exposed) : 0) << ' '
        << (dp ? median(overlapped) : 0) << ' ' << (dp ? dp->bucket_bytes().size() : 0) << ' '
        << s.sequence.size() << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"remat data-parallel benchmark (Gloo, CPU)"};
  app.add_option("--model", a.model)->capture_default_str();
  app.add_option("--batch", a.batch, "Batch per rank")->capture_default_str();
  app.add_option("--image", a.image)->capture_default_str();
  app.add_option("--budget", a.budget_percent, "Budget per rank, % of store-all")->capture_default_str();
  app.add_option("--steps", a.steps)->capture_default_str();
  app.add_option("--threads", a.threads, "LibTorch threads per rank")->capture_default_str();
  app.add_option("--procs", a.procs, "Numbers of ranks to run (1,2,3)")->delimiter(',')->capture_default_str();
  app.add_option("--out", a.out, "(a rank: where rank 0 writes its figures)");
  app.add_flag("--plain", a.plain, "(a rank: one process without DataParallel)");
  CLI11_PARSE(app, argc, argv);
  if (!a.out.empty()) return rank_main(a);

  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string file = std::filesystem::temp_directory_path().string() + "/remat-dp-bench-" +
                           std::to_string(::getpid());
  std::vector<std::string> base{self,        "--model", a.model, "--batch",
                                std::to_string(a.batch), "--image", std::to_string(a.image),
                                "--budget", std::to_string(a.budget_percent), "--steps",
                                std::to_string(a.steps), "--threads", std::to_string(a.threads),
                                "--out", file};
  std::printf("%s, batch %d per rank, %dx%d, budget %d%% of store-all per rank, %d LibTorch "
              "thread(s) per rank, median of %d steps\n\n",
              a.model.c_str(), a.batch, a.image, a.image, a.budget_percent, a.threads, a.steps);
  std::printf("| ranks | step (ms) | vs 1 process | backward (ms) | all-reduce (ms) | hidden by the backward | exposed (ms) | buckets launched during the backward |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  double baseline = 0;
  std::vector<std::pair<std::string, int>> runs{{"1, no DataParallel", 0}};
  for (int p : a.procs) runs.emplace_back(std::to_string(p), p);
  for (const auto& [label, p] : runs) {
    std::vector<std::string> command = base;
    if (p == 0) command.push_back("--plain");
    const auto exits = remat::distributed::launch_local(
        command, std::max(p, 1),
        remat::distributed::LaunchOptions().master("127.0.0.1", remat::distributed::free_local_port()));
    for (const auto& e : exits)
      if (e.code != 0) {
        std::fprintf(stderr, "rank %d of %s failed with code %d\n", e.rank, label.c_str(), e.code);
        return 1;
      }
    std::ifstream in(file);
    double step = 0, backward = 0, all_reduce = 0, hidden = 0, exposed = 0, overlapped = 0, buckets = 0, ops = 0;
    in >> step >> backward >> all_reduce >> hidden >> exposed >> overlapped >> buckets >> ops;
    if (p == 0) {
      baseline = step;
      std::printf("| %s | %.1f | 1.00 | | | | | |\n", label.c_str(), step);
    } else {
      std::printf("| %s | %.1f | %.2f | %.1f | %.1f | %.0f%% | %.1f | %.0f of %.0f |\n", label.c_str(), step,
                  step / baseline, backward, all_reduce, all_reduce > 0 ? 100 * hidden / all_reduce : 100.0,
                  exposed, overlapped, buckets);
    }
    std::fflush(stdout);
  }
  std::remove(file.c_str());
  return 0;
}
