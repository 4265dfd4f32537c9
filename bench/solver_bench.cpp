// remat_solver_bench: time and memory of the optimal solver on synthetic chains.
//
// For each chain length L and slot count it solves a pseudo-random CNN-like chain at 40% of
// its store-all peak and prints a markdown table: the median wall time of the solve and the
// peak resident memory of the process that ran it. Each repetition runs in a forked child so
// that its peak RSS is its own: a process's high-water mark never goes down, and an
// allocator keeps freed pages, so measuring several solves in one process would report the
// largest one for all of them.
//
// Usage: remat_solver_bench [--quick] [--L N] [--slots N] [--threads T] [--reps R]
//                           [--offload D2H,H2D,LATENCY [--host-percent P]]

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "remat/solver/chain.h"
#include "remat/solver/solver.h"

namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::uint64_t kSeed = 20240611;
constexpr double kBudgetFraction = 0.4;
// When 40% of store-all is infeasible, the budget becomes this multiple of the smallest one.
constexpr double kInfeasibleMargin = 1.2;
const std::vector<int> kLengths = {30, 100, 300, 1000};
const std::vector<std::int64_t> kSlotCounts = {500, 2000};

struct Args {
  bool quick = false;
  int length = 0;          // 0: every length
  std::int64_t slots = 0;  // 0: every slot count
  int threads = 0;         // 0: one per available core
  int reps = 0;            // 0: 5; 3 for L >= 1000; 1 for L >= 1000 with more than 500 slots
  std::optional<remat::Link> link;  // --offload: solve with offload over this link
  int host_percent = 0;  // --host-percent: bound the host memory to P% of what it holds unbounded
};

void print_usage(std::ostream& out) {
  out << "usage: remat_solver_bench [--quick] [--L N] [--slots N] [--threads T] [--reps R]\n"
         "                          [--offload D2H,H2D,LATENCY [--host-percent P]]\n"
         "  --quick      only L in {30, 100, 300}\n"
         "  --L N        only chains of N stages\n"
         "  --slots N    only N memory slots (default: 500 and 2000)\n"
         "  --threads T  solver threads (default 0: one per available core)\n"
         "  --reps R     repetitions per configuration (default 5; 3 for L >= 1000, 1 there\n"
         "               above 500 slots)\n"
         "  --offload D2H,H2D,LATENCY\n"
         "               solve with offload over a link of D2H and H2D GB/s and LATENCY ms\n"
         "  --host-percent P\n"
         "               with --offload: bound the host memory to P% (1 to 99) of what the\n"
         "               schedule without a bound holds (SolveOptions::host_memory_bytes)\n";
}

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "remat_solver_bench: " << message << "\n";
  print_usage(std::cerr);
  std::exit(2);
}

std::int64_t parse_positive(const std::string& flag, const char* text, std::int64_t min_value) {
  if (text == nullptr) usage_error(flag + " needs a value");
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < min_value) {
    usage_error(flag + " expects an integer >= " + std::to_string(min_value) + ", got '" + text +
                "'");
  }
  return value;
}

// D2H,H2D,LATENCY: GB/s, GB/s, ms.
remat::Link parse_link(const std::string& flag, const char* text) {
  if (text == nullptr) usage_error(flag + " needs a value");
  double values[3] = {0, 0, 0};
  char comma[2] = {0, 0};
  if (std::sscanf(text, "%lf%c%lf%c%lf", &values[0], &comma[0], &values[1], &comma[1],
                  &values[2]) != 5 ||
      comma[0] != ',' || comma[1] != ',')
    usage_error(flag + " expects D2H,H2D,LATENCY (GB/s, GB/s, ms), got '" + text + "'");
  return remat::Link{values[0], values[1], values[2]};  // Chain::validate checks the range
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (flag == "--quick") {
      args.quick = true;
      continue;
    }
    if (flag == "-h" || flag == "--help") {
      print_usage(std::cout);
      std::exit(0);
    }
    if (flag == "--L") {
      args.length = static_cast<int>(parse_positive(flag, value, 1));
    } else if (flag == "--slots") {
      args.slots = parse_positive(flag, value, 1);
    } else if (flag == "--threads") {
      args.threads = static_cast<int>(parse_positive(flag, value, 0));
    } else if (flag == "--reps") {
      args.reps = static_cast<int>(parse_positive(flag, value, 1));
    } else if (flag == "--offload") {
      args.link = parse_link(flag, value);
    } else if (flag == "--host-percent") {
      args.host_percent = static_cast<int>(parse_positive(flag, value, 1));
      if (args.host_percent > 99) usage_error("--host-percent expects 1 to 99");
    } else {
      usage_error("unknown argument '" + flag + "'");
    }
    ++i;
  }
  if (args.host_percent > 0 && !args.link) usage_error("--host-percent needs --offload");
  return args;
}

// Raw mt19937_64 output is specified by the standard, unlike std::uniform_real_distribution,
// so the chains are the same with every standard library.
class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) {
    const double unit = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
    return lo + (hi - lo) * unit;
  }

 private:
  std::mt19937_64 engine_;
};

// A CNN-like chain: activations log-uniform in [1, 64] MiB (spatial sizes shrink and grow by
// powers of two in real networks), a stage keeping 1-4x its output for its backward, a
// transient buffer in one stage out of five, backwards 1.5-2.5x their forward.
remat::Chain make_chain(int length) {
  Random random(kSeed);
  remat::Chain chain;
  chain.name = "bench-L" + std::to_string(length);
  chain.set_input(16 * kMiB);  // a batch of 32 RGB 224x224 float images is 18.4 MiB
  chain.loss_tmp_bytes = kMiB;
  for (int i = 0; i < length; ++i) {
    const auto out = static_cast<std::int64_t>(std::exp2(random.uniform(20.0, 26.0)));
    const auto saved = static_cast<std::int64_t>(out * random.uniform(1.0, 4.0));
    remat::Stage stage = remat::Stage::keeping_all("s" + std::to_string(i), out, saved);
    const double has_fwd_tmp = random.uniform(0.0, 1.0);
    const double fwd_tmp = random.uniform(0.0, 1.0);
    const double has_bwd_tmp = random.uniform(0.0, 1.0);
    const double bwd_tmp = random.uniform(0.0, 1.0);
    if (has_fwd_tmp < 0.2) stage.fwd_tmp_bytes = static_cast<std::int64_t>(out * fwd_tmp);
    if (has_bwd_tmp < 0.2) stage.bwd_tmp_bytes = static_cast<std::int64_t>(out * bwd_tmp);
    stage.fwd_ms = random.uniform(0.1, 5.0);
    stage.bwd_ms = stage.fwd_ms * random.uniform(1.5, 2.5);
    stage.fwd_nograd_ms = stage.fwd_ms * random.uniform(0.9, 1.0);
    chain.stages.push_back(std::move(stage));
  }
  chain.validate(chain.name);
  return chain;
}

// What a child reports through its pipe; plain data, written and read as bytes.
struct Measurement {
  bool ok = false;
  char error[256] = {};
  double wall_seconds = 0;
  int status = 0;  // remat::SolveStatus
  double makespan_ms = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t min_feasible_budget_bytes = 0;
  std::int64_t host_peak_bytes = 0;
  std::int64_t rss_before_bytes = 0;
  std::int64_t max_rss_bytes = 0;
};

std::int64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t total_pages = 0, resident_pages = 0;
  if (!(statm >> total_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

std::int64_t max_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

Measurement solve_here(const remat::Chain& chain, const remat::SolveOptions& options) {
  Measurement m;
  try {
    m.rss_before_bytes = current_rss_bytes();
    const auto started = std::chrono::steady_clock::now();
    const remat::Solution solution = remat::solve(chain, options);
    m.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    m.max_rss_bytes = max_rss_bytes();
    m.status = static_cast<int>(solution.status);
    m.makespan_ms = solution.makespan_ms;
    m.peak_bytes = solution.peak_bytes;
    m.min_feasible_budget_bytes = solution.min_feasible_budget_bytes;
    m.host_peak_bytes = solution.simulation.host_peak_bytes;
    m.ok = true;
  } catch (const std::exception& error) {
    std::snprintf(m.error, sizeof m.error, "%s", error.what());
  }
  return m;
}

bool write_all(int fd, const void* data, std::size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = write(fd, bytes, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    bytes += written;
    size -= static_cast<std::size_t>(written);
  }
  return true;
}

std::size_t read_all(int fd, void* data, std::size_t size) {
  char* bytes = static_cast<char*>(data);
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = read(fd, bytes + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  return got;
}

// Solves in a forked child. The parent never starts a thread, so forking it is safe.
Measurement solve_in_child(const remat::Chain& chain, const remat::SolveOptions& options) {
  Measurement m;
  int fds[2];
  if (pipe(fds) != 0) {
    std::snprintf(m.error, sizeof m.error, "pipe failed: %s", std::strerror(errno));
    return m;
  }
  std::cout.flush();
  std::cerr.flush();
  const pid_t pid = fork();
  if (pid < 0) {
    std::snprintf(m.error, sizeof m.error, "fork failed: %s", std::strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return m;
  }
  if (pid == 0) {
    close(fds[0]);
    const Measurement result = solve_here(chain, options);
    // _exit: the child must not run the parent's atexit handlers or flush its streams twice.
    _exit(write_all(fds[1], &result, sizeof result) ? 0 : 1);
  }
  close(fds[1]);
  const std::size_t got = read_all(fds[0], &m, sizeof m);
  close(fds[0]);
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  if (got != sizeof m) {
    m = Measurement{};
    if (WIFSIGNALED(wait_status)) {
      std::snprintf(m.error, sizeof m.error, "child killed by signal %d (%s)",
                    WTERMSIG(wait_status), strsignal(WTERMSIG(wait_status)));
    } else {
      std::snprintf(m.error, sizeof m.error, "child exited with status %d and no result",
                    WEXITSTATUS(wait_status));
    }
  }
  return m;
}

using remat::bench::median;

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string mib(std::int64_t bytes) { return fixed(static_cast<double>(bytes) / kMiB, 1); }

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

struct Row {
  int length = 0;
  std::int64_t slots = 0;
  std::string cells;  // everything after L and slots
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  std::vector<int> lengths;
  if (args.length > 0) {
    lengths = {args.length};
  } else {
    for (int length : kLengths) {
      if (!args.quick || length < 1000) lengths.push_back(length);
    }
  }
  const std::vector<std::int64_t> slot_counts =
      args.slots > 0 ? std::vector<std::int64_t>{args.slots} : kSlotCounts;

  std::vector<Row> rows;
  std::vector<std::string> notes;
  for (int length : lengths) {
    remat::Chain chain = make_chain(length);
    chain.link = args.link;
    try {
      chain.validate(chain.name);
    } catch (const std::exception& e) {
      usage_error(std::string("--offload: ") + e.what());
    }
    const std::int64_t store_all = remat::store_all_peak(chain);
    const auto nominal_budget = static_cast<std::int64_t>(kBudgetFraction * store_all);
    notes.push_back("L=" + std::to_string(length) + ": store-all peak " + mib(store_all) +
                    " MiB, budget " + mib(nominal_budget) + " MiB (40%)");
    for (std::int64_t slots : slot_counts) {
      // This machine is shared: medians of several runs, fewer where one run takes minutes.
      const int reps = args.reps > 0 ? args.reps : length < 1000 ? 5 : slots <= 500 ? 3 : 1;
      std::int64_t budget = nominal_budget;
      std::vector<Measurement> runs;
      std::string failure;
      std::int64_t host_bound = -1;  // --host-percent: from the first solve without a bound
      while (static_cast<int>(runs.size()) < reps) {
        std::cerr << "solving L=" << length << " slots=" << slots << " (rep " << runs.size() + 1
                  << "/" << reps << ") ..." << std::flush;
        remat::SolveOptions options = remat::SolveOptions(budget)
                                          .slots(slots)
                                          .threads(args.threads)
                                          .offload(args.link.has_value());
        if (args.host_percent > 0 && host_bound < 0) {
          const Measurement free = solve_in_child(chain, options);
          if (free.ok && free.status != static_cast<int>(remat::SolveStatus::kInfeasible)) {
            host_bound = free.host_peak_bytes * args.host_percent / 100;
            notes.push_back("L=" + std::to_string(length) + " slots=" + std::to_string(slots) +
                            ": host bound " + mib(host_bound) + " MiB, " +
                            std::to_string(args.host_percent) + "% of " +
                            mib(free.host_peak_bytes) + " MiB held without it (makespan " +
                            fixed(free.makespan_ms, 2) + " ms)");
          }
        }
        if (host_bound >= 0) options.host_memory_bytes(host_bound);
        const Measurement m = solve_in_child(chain, options);
        if (!m.ok) {
          std::cerr << " failed: " << m.error << "\n";
          failure = m.error;
          break;
        }
        std::cerr << " " << fixed(m.wall_seconds, 3) << " s, peak RSS " << mib(m.max_rss_bytes)
                  << " MiB\n";
        const auto status = static_cast<remat::SolveStatus>(m.status);
        if (status == remat::SolveStatus::kInfeasible && budget == nominal_budget) {
          budget = static_cast<std::int64_t>(kInfeasibleMargin *
                                             static_cast<double>(m.min_feasible_budget_bytes));
          notes.push_back("L=" + std::to_string(length) + " slots=" + std::to_string(slots) +
                          ": 40% budget infeasible (min " + mib(m.min_feasible_budget_bytes) +
                          " MiB), used 1.2x min = " + mib(budget) + " MiB");
          std::cerr << "  infeasible; retrying with " << mib(budget) << " MiB\n";
          continue;
        }
        runs.push_back(m);
      }
      Row row{length, slots, ""};
      if (runs.empty()) {
        row.cells = "- | - | - | - | error: " + failure;
      } else {
        std::vector<double> seconds;
        std::int64_t peak_rss = 0, table_bytes = 0;
        for (const Measurement& m : runs) {
          seconds.push_back(m.wall_seconds);
          peak_rss = std::max(peak_rss, m.max_rss_bytes);
          table_bytes = std::max(table_bytes, m.max_rss_bytes - m.rss_before_bytes);
        }
        const Measurement& last = runs.back();
        const auto status = static_cast<remat::SolveStatus>(last.status);
        row.cells = fixed(median(seconds), 4) + " | " + mib(peak_rss) + " | " + mib(table_bytes) +
                    " | " + fixed(last.makespan_ms, 2) + " | " +
                    std::string(remat::status_name(status));
        if (host_bound >= 0) row.cells += ", host " + mib(last.host_peak_bytes) + " MiB";
        if (!failure.empty()) row.cells += " (then: " + failure + ")";
      }
      rows.push_back(std::move(row));
    }
  }

  std::cout
      << "| L | slots | solve s (median) | peak RSS MiB | table MiB | makespan ms | status |\n"
         "|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Row& row : rows) {
    std::cout << "| " << row.length << " | " << row.slots << " | " << row.cells << " |\n";
  }
  const int cpus = remat::available_cores();
  if (args.link)
    std::cout << "\noffload over a link of " << args.link->d2h_gbps << " GB/s out, "
              << args.link->h2d_gbps << " GB/s back, " << args.link->latency_ms << " ms latency\n";
  std::cout << "\n"
            << "peak RSS: the solving child's ru_maxrss; table MiB: that minus its RSS before the "
               "solve (what the solve allocated, DP table included).\n"
            << "budgets:\n";
  for (const std::string& note : notes) std::cout << "  " << note << "\n";
  std::cout << "machine: " << cpu_model() << ", available cores " << cpus << "\n"
            << "threads: "
            << (args.threads > 0 ? std::to_string(args.threads)
                                 : "default (one per available core: " + std::to_string(cpus) + ")")
            << "\n";
  return 0;
}
