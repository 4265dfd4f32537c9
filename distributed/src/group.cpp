#include "remat/distributed/group.h"

#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/version.h>
#ifdef __linux__
#include <sys/prctl.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "backends.h"
#include "remat/base/text.h"
#include "remat/distributed/launcher.h"

namespace remat::distributed {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::uint8_t> bytes_of(const std::string& text) {
  return std::vector<std::uint8_t>(text.begin(), text.end());
}
std::string text_of(const std::vector<std::uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// A whole number in [low, high] from the environment variable `name`, or `fallback` if unset.
int env_int(const char* name, int low, int high, std::optional<int> fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    if (fallback) return *fallback;
    throw InputError(fmt::format("{} is not set (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, "
                                 "MASTER_ADDR and MASTER_PORT)", name));
  }
  // The value as the message quotes it: escaped, and at most 40 bytes of it.
  const std::string given(text);
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0')
    throw InputError(fmt::format("{}={} is not a whole number (from {} to {})", name,
                                 quoted(given, 40), low, high));
  if (errno != 0 || value < low || value > high)
    throw InputError(fmt::format("{}={} is out of range: it must be from {} to {}", name,
                                 shortened(given, 40), low, high));
  return static_cast<int>(value);
}

// The rendezvous store at env's address: rank 0's server, or a client of it.
c10::intrusive_ptr<c10d::TCPStore> tcp_store(const Environment& env, bool server,
                                             std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = server;
  if (server) options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = false;
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
}

// A rank that launch_local started dies with its launcher (PR_SET_PDEATHSIG survives the exec
// of `remat` into its LibTorch helper); if the launcher is already gone, at once.
void die_with_launcher() {
#ifdef __linux__
  const char* launcher = std::getenv(kLauncherPidVariable);
  if (launcher == nullptr || *launcher == '\0') return;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (std::to_string(::getppid()) != launcher) ::raise(SIGKILL);
#endif
}

// A rank's heartbeat counter (add 0 reads it without waiting).
std::int64_t heartbeat_of(c10d::Store& store, int rank) {
  return store.add(fmt::format("heartbeat/{}", rank), 0);
}

std::string stopped_answering(int rank) {
  return fmt::format("rank {} stopped answering (its heartbeat stopped: killed, or hung)", rank);
}

// Why `host` does not resolve (getaddrinfo's words), or nothing when it does.
std::optional<std::string> unresolvable(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int code = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (code == 0) {
    ::freeaddrinfo(found);
    return std::nullopt;
  }
  return std::string(::gai_strerror(code));
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// The first line where two descriptions differ, 1-based, with each side's text.
struct LineDifference {
  std::size_t line = 0;
  std::string ours, theirs;
};
LineDifference first_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  LineDifference d;
  for (std::size_t line = 1;; ++line) {
    std::string la, lb;
    const bool ha = static_cast<bool>(std::getline(sa, la));
    const bool hb = static_cast<bool>(std::getline(sb, lb));
    if (!ha && !hb) break;
    if (!ha || !hb || la != lb) {
      d.line = line;
      d.ours = ha ? la : "(nothing: it ends before)";
      d.theirs = hb ? lb : "(nothing: it ends before)";
      return d;
    }
  }
  return d;
}

// "rank 3", "ranks 1, 4 and 6", "ranks 1-999 and 1002": consecutive ranks as a range, and at
// most 10 ranges, then how many ranks in all (a job of 65,536 ranks that never joined is one
// short line).
std::string rank_list(const std::vector<int>& ranks) {
  std::vector<std::string> runs;
  for (std::size_t k = 0; k < ranks.size();) {
    std::size_t end = k + 1;
    while (end < ranks.size() && ranks[end] == ranks[end - 1] + 1) ++end;
    runs.push_back(end - k == 1 ? std::to_string(ranks[k])
                   : end - k == 2
                       ? std::to_string(ranks[k]) + ", " + std::to_string(ranks[k + 1])
                       : std::to_string(ranks[k]) + "-" + std::to_string(ranks[end - 1]));
    k = end;
  }
  std::string out;
  const std::size_t shown = std::min<std::size_t>(runs.size(), 10);
  for (std::size_t k = 0; k < shown; ++k)
    out += (k == 0 ? "" : (k + 1 == runs.size() ? " and " : ", ")) + runs[k];
  if (shown < runs.size()) out += fmt::format(", ... ({} ranks in all)", ranks.size());
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

// LibTorch 1.13's TCPStore runs a thread for each store client, on every rank (its watchKey
// listener), that lets its socket errors escape: when the connection to rank 0's store is reset
// (rank 0 killed), std::system_error ends that thread in std::terminate, and the rank would die
// of SIGABRT instead of saying that rank 0 stopped answering. On a rank other than 0, a
// std::system_error that escapes a thread other than the one that made the group is such an
// error: remat's own threads catch theirs, and c10d's collectives hand theirs to the calling
// thread. It is reported as that thread reports the loss of rank 0, with the exit code of
// GroupOptions::store_thread_exit_code. Anything else goes to the previous handler.
struct StoreThreadHandler {
  std::mutex mutex;
  bool installed = false;
  std::thread::id group_thread;
  std::terminate_handler previous = nullptr;
  std::string lost;  // "rank R: rank 0 stopped answering (... at HOST:PORT failed"
  int exit_code = 5;
};
StoreThreadHandler& store_thread_handler() {
  static auto* handler = new StoreThreadHandler;  // never destroyed: a thread may end late
  return *handler;
}

[[noreturn]] void on_terminate() {
  StoreThreadHandler& h = store_thread_handler();
  std::terminate_handler previous = nullptr;
  {
    // try_lock: a terminate inside install_store_thread_handler must not wait for itself.
    std::unique_lock<std::mutex> lock(h.mutex, std::try_to_lock);
    if (lock.owns_lock()) {
      previous = h.previous;
      if (std::this_thread::get_id() != h.group_thread) {
        if (const std::exception_ptr error = std::current_exception()) {
          try {
            std::rethrow_exception(error);
          } catch (const std::system_error& e) {
            fmt::print(stderr, "remat: {}; LibTorch's store thread said: {})\n", h.lost,
                       printable(e.what()));
            std::fflush(stderr);
            std::_Exit(h.exit_code);
          } catch (...) {
          }
        }
      }
    }
  }
  if (previous != nullptr) previous();
  std::abort();
}

// Installs on_terminate once per process (ranks other than 0, unless exit_code is 0); a later
// group's rank, store address (`where`, HOST:PORT) and code replace an earlier one's.
void install_store_thread_handler(int rank, const std::string& where, int exit_code) {
  if (rank == 0 || exit_code == 0) return;
  StoreThreadHandler& h = store_thread_handler();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.group_thread = std::this_thread::get_id();
  h.lost = fmt::format(
      "rank {}: rank 0 stopped answering (the connection to the rendezvous store it hosts at "
      "{} failed",
      rank, where);
  h.exit_code = exit_code;
  if (!h.installed) {
    h.previous = std::set_terminate(on_terminate);
    h.installed = true;
  }
}

}  // namespace

void Environment::check(const std::string& source) const {
  if (world_size < 1)
    throw InputError(fmt::format("{}: the world size must be at least 1, not {}", source, world_size));
  if (rank < 0 || rank >= world_size)
    throw InputError(fmt::format("{}: rank {} is not below the world size {}", source, rank, world_size));
  if (local_rank < 0)
    throw InputError(fmt::format("{}: the local rank must not be negative, not {}", source, local_rank));
  if (master_port < 1 || master_port > 65535)
    throw InputError(fmt::format("{}: the master port must be from 1 to 65535, not {}", source, master_port));
  if (master_addr.empty()) throw InputError(fmt::format("{}: the master address is empty", source));
}

bool Environment::in_env() {
  for (const char* name : {"RANK", "WORLD_SIZE"})
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return true;
  return false;
}

Environment Environment::from_env() {
  Environment env;
  env.world_size = env_int("WORLD_SIZE", 1, kMaxRanks, std::nullopt);
  env.rank = env_int("RANK", 0, env.world_size - 1, std::nullopt);
  env.local_rank = env_int("LOCAL_RANK", 0, 1 << 20, env.rank);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr) {
    env.master_addr = addr;
    if (env.master_addr.empty()) throw InputError("MASTER_ADDR is set but empty");
  }
  if (const char* port = std::getenv("MASTER_PORT"); port != nullptr && *port == '\0')
    throw InputError("MASTER_PORT is set but empty");
  env.master_port = env_int("MASTER_PORT", 1, 65535, 29500);
  return env;
}

BackendKind parse_backend(const std::string& name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "gloo") return BackendKind::kGloo;
  if (name == "nccl") return BackendKind::kNccl;
  throw InputError(fmt::format("unknown backend '{}': expected auto, gloo or nccl", name));
}

BackendKind resolve_backend(BackendKind kind, c10::Device device) {
  if (kind != BackendKind::kAuto) return kind;
  return device.is_cuda() ? BackendKind::kNccl : BackendKind::kGloo;
}

void check_backend(BackendKind kind, c10::Device device) {
  if (kind == BackendKind::kNccl && !device.is_cuda())
    throw InputError(fmt::format("the nccl backend needs a CUDA device, not {}", device.str()));
  if (kind == BackendKind::kNccl && !has_nccl())
    throw InputError(
        "the nccl backend: this build of remat has no NCCL (it needs a LibTorch with "
        "CUDA and NCCL's headers); use --backend gloo");
}

std::string host_port(const std::string& host, int port) {
  return host.find(':') == std::string::npos ? fmt::format("{}:{}", host, port)
                                             : fmt::format("[{}]:{}", host, port);
}

const char* backend_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto: return "auto";
    case BackendKind::kGloo: return "gloo";
    case BackendKind::kNccl: return "nccl";
  }
  return "?";
}

std::shared_ptr<Group> Group::create(const Environment& env, c10::Device device,
                                     const GroupOptions& options) {
  env.check("the job's environment");
  die_with_launcher();
  // A rank is alive while its heartbeat (every tenth of the timeout, 50 ms at least) moves:
  // a shorter timeout would take a healthy rank for a dead one.
  if (options.timeout() < std::chrono::milliseconds(200))
    throw InputError(
        fmt::format("the timeout must be at least 200 ms (ranks beat every 50 ms "
                    "at least), not {} ms",
                    options.timeout().count()));
  const BackendKind kind = resolve_backend(options.backend(), device);
  check_backend(kind, device);
  const std::string where = host_port(env.master_addr, env.master_port);
  install_store_thread_handler(env.rank, where, options.store_thread_exit_code());
  // A name that does not resolve is said so, rather than left to the store's connect
  // (which rank 0 would report as a port in use, and the others as rank 0 not starting).
  if (const auto why = unresolvable(env.master_addr))
    throw DistributedError(fmt::format("rank {}: the master address '{}' does not resolve: {}",
                                       env.rank, env.master_addr, *why),
                           {});

  // The rendezvous: rank 0 hosts the store; every rank announces itself and waits for the
  // others, so that one that never comes is named.
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = tcp_store(env, env.rank == 0, options.startup_timeout());
  } catch (const std::exception& error) {
    if (env.rank == 0)
      throw DistributedError(fmt::format("rank 0 cannot host the rendezvous at {} (is the port "
                                         "in use?): {}", where, message_of(error)), {});
    throw DistributedError(fmt::format("rank {} could not reach the rendezvous at {} within {} ms: "
                                       "rank 0 did not start, or MASTER_ADDR/MASTER_PORT differ "
                                       "between ranks: {}",
                                       env.rank, where, options.startup_timeout().count(), message_of(error)),
                           {0});
  }
  try {
    auto ours = c10::make_intrusive<c10d::PrefixStore>("remat", store);
    // Each rank says the job's size it was started for: ranks started with different --nproc
    // (WORLD_SIZE) are refused, naming them, rather than one waiting for a rank that never comes.
    ours->set(fmt::format("joined/{}", env.rank), bytes_of(std::to_string(env.world_size)));
    std::map<int, std::string> sizes;  // the ranks that joined: the size each was started for
    const std::string own = std::to_string(env.world_size);
    const auto deadline = Clock::now() + options.startup_timeout();
    for (;;) {
      std::vector<int> missing;
      const bool late = Clock::now() > deadline;
      for (int r = 0; r < env.world_size; ++r) {
        if (sizes.count(r) != 0) continue;
        // Past the deadline the ranks not yet seen are missing: not asked one by one, which
        // for a job of tens of thousands would take longer than the timeout.
        if (late || Clock::now() > deadline) {
          missing.push_back(r);
          continue;
        }
        if (ours->check({fmt::format("joined/{}", r)}))
          sizes[r] = text_of(ours->get(fmt::format("joined/{}", r)));
        else
          missing.push_back(r);
      }
      if (std::any_of(sizes.begin(), sizes.end(), [&](const auto& s) { return s.second != own; })) {
        std::string said;
        for (const auto& [r, size] : sizes)
          said += fmt::format("{}rank {} for {}", said.empty() ? "" : ", ", r, size);
        // Rank 0 hosts the store: it stays until the others have read it, so that they too
        // say why, rather than that rank 0 is gone.
        ours->set(fmt::format("seen/{}", env.rank), bytes_of("1"));
        const auto until = Clock::now() + std::chrono::seconds(3);
        if (env.rank == 0)
          for (const auto& entry : sizes)
            while (entry.first != 0 && Clock::now() < until &&
                   !ours->check({fmt::format("seen/{}", entry.first)}))
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
        throw InputError(fmt::format(
            "rank {}: the ranks were started for jobs of different sizes ({} ranks); every rank "
            "must be started with the same --nproc (WORLD_SIZE)",
            env.rank, said));
      }
      if (missing.empty()) break;
      if (Clock::now() > deadline)
        throw DistributedError(
            fmt::format("{} did not join the rendezvous at {} within {} ms", rank_list(missing),
                        where, options.startup_timeout().count()),
            missing);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const InputError&) {
    throw;
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& error) {  // the store went away while the ranks joined
    throw DistributedError(
        fmt::format("rank {}: the rendezvous at {} failed while the ranks joined: {}{}", env.rank,
                    where, message_of(error),
                    env.rank == 0 ? "" : " (rank 0, which hosts it, stopped)"),
        env.rank == 0 ? std::vector<int>{} : std::vector<int>{0});
  }

  Collectives backend;
  auto backend_store = c10::make_intrusive<c10d::PrefixStore>(backend_name(kind), store);
  try {
    if (kind == BackendKind::kGloo) {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.startup_timeout());
      if (is_loopback(env.master_addr))
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      else if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      else
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(backend_store, env.rank,
                                                              env.world_size, gloo_options);
      // Connected within the start-up timeout; every collective from now on within the timeout.
      // ProcessGroupGloo::setTimeout came with LibTorch 2.9 (pytorch#158128). Before, Gloo keeps
      // the first for its collectives: remat's own waits still stop at the timeout, and a
      // collective left behind is abandoned with the group (~Group).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
      try {
        gloo->setTimeout(options.timeout());
      } catch (const c10::Error&) {
        // "does not support setting timeout": as before 2.9
      }
#endif
      backend = Collectives::of(gloo);
    } else {
      backend = detail::make_nccl_backend(backend_store, env.rank, env.world_size, options.timeout());
    }
  } catch (const std::exception& error) {
    throw DistributedError(fmt::format("rank {}: the {} process group of {} could not "
                                       "connect: {}",
                                       env.rank, backend_name(kind),
                                       counted(env.world_size, "rank"), message_of(error)),
                           {});
  }
  return std::make_shared<Group>(store, backend, options.timeout(), env);
}

Group::Group(c10::intrusive_ptr<c10d::Store> store, Collectives collectives,
             std::chrono::milliseconds timeout, std::optional<Environment> env)
    : store_(c10::make_intrusive<c10d::PrefixStore>("remat", std::move(store))),
      collectives_(std::move(collectives)),
      rank_(collectives_.rank),
      size_(collectives_.size),
      timeout_(timeout),
      env_(std::move(env)),
      heartbeat_interval_(std::clamp<std::chrono::milliseconds>(
          timeout / 10, std::chrono::milliseconds(50), std::chrono::milliseconds(1000))) {
  if (env_) start_heartbeat();
}

Group::~Group() {
  leave();
  stop_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
  // A collective still waiting for the lost rank would hold the backend's destructor until it
  // times out on its own, one queued collective after another (Gloo on LibTorch 1.13 waits the
  // start-up timeout): abandoned to the process's exit instead.
  if (failed_) (void)collectives_.owner.release();
}

c10::intrusive_ptr<c10d::Store> Group::connect(std::chrono::milliseconds timeout) const {
  return c10::make_intrusive<c10d::PrefixStore>("remat", tcp_store(*env_, false, timeout));
}

void Group::start_heartbeat() {
  heartbeat_ = std::thread([this] {
    try {
      auto store = connect(timeout_);
      const std::string name = fmt::format("heartbeat/{}", rank_);
      while (!stop_) {
        store->add(name, 1);
        for (auto slept = std::chrono::milliseconds(0); slept < heartbeat_interval_ && !stop_;
             slept += std::chrono::milliseconds(10))
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (...) {
      // The store is gone (rank 0 stopped): the collectives will fail and say so.
    }
  });
}

void Group::leave() noexcept {
  if (left_) return;
  left_ = true;
  try {
    store_->set(fmt::format("left/{}", rank_), bytes_of("1"));
    if (rank_ != 0 || !env_) return;
    const auto deadline = Clock::now() + timeout_;
    std::vector<std::int64_t> beats(static_cast<std::size_t>(size_), -1);
    std::vector<Clock::time_point> changed(static_cast<std::size_t>(size_), Clock::now());
    for (;;) {
      bool waiting = false;
      for (int r = 1; r < size_; ++r) {
        if (std::find(failed_ranks_.begin(), failed_ranks_.end(), r) != failed_ranks_.end())
          continue;  // named by failure(): dead or hung, not to be waited for
        if (store_->check({fmt::format("left/{}", r)})) continue;
        const auto ur = static_cast<std::size_t>(r);
        const std::int64_t beat = heartbeat_of(*store_, r);
        if (beat != beats[ur]) {
          beats[ur] = beat;
          changed[ur] = Clock::now();
        }
        if (Clock::now() - changed[ur] < heartbeat_interval_ * 3) waiting = true;
      }
      if (!waiting || Clock::now() > deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (...) {
  }
}

void Group::report_failure(const std::string& message) noexcept {
  failed_ = true;
  try {
    store_->set(fmt::format("error/{}", rank_), bytes_of(message));
  } catch (...) {
  }
}

void Group::check_usable(const std::string& during) const {
  if (!failed_) return;
  throw DistributedError(
      fmt::format("rank {}: {}: this group failed before (see the first error), and a failed "
                  "group cannot be used again: start a new job",
                  rank_, during),
      failed_ranks_);
}

void Group::mark_progress(std::int64_t step) {
  check_usable(fmt::format("starting step {}", step + 1));
  step_ = step;
  store_->set(fmt::format("progress/{}", rank_), bytes_of(std::to_string(step)));
}

bool Group::any_failure_reported() {
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && store_->check({fmt::format("error/{}", r)})) return true;
  return false;
}

DistributedError Group::failure(const std::string& during, const std::exception& cause) {
  const std::string said = message_of(cause);
  std::vector<int> failed;
  std::vector<std::string> why;
  if (!env_) {
    return DistributedError(fmt::format("rank {}: {} failed: {}", rank_, during, said), {});
  }
  try {
    auto store = connect(std::max(heartbeat_interval_ * 4, std::chrono::milliseconds(2000)));
    std::vector<std::int64_t> before(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) before[static_cast<std::size_t>(r)] = heartbeat_of(*store, r);
    std::this_thread::sleep_for(heartbeat_interval_ * 2 + std::chrono::milliseconds(100));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const std::string error_key = fmt::format("error/{}", r);
      if (store->check({error_key})) {
        failed.push_back(r);
        why.push_back(fmt::format("rank {} failed: {}", r, text_of(store->get(error_key))));
      } else if (heartbeat_of(*store, r) == before[static_cast<std::size_t>(r)]) {
        failed.push_back(r);
        why.push_back(stopped_answering(r));
      } else if (const std::string key = fmt::format("progress/{}", r); step_ >= 0) {
        const std::int64_t step = store->check({key}) ? std::stoll(text_of(store->get(key))) : -1;
        if (step < step_) {
          failed.push_back(r);
          why.push_back(fmt::format("rank {} is behind, at step {} where this rank is at step {} "
                                    "(hung, or slower than the timeout)", r, step + 1, step_ + 1));
        }
      }
    }
  } catch (const std::exception&) {
    if (rank_ != 0) {
      failed = {0};
      why = {fmt::format("rank 0 stopped answering (the rendezvous store it hosts at {} is gone)",
                         host_port(env_->master_addr, env_->master_port))};
    }
  }
  failed_ranks_.insert(failed_ranks_.end(), failed.begin(), failed.end());
  failed_ = true;
  std::string message = fmt::format("rank {}: {} failed", rank_, during);
  if (why.empty()) message += " (no other rank is known to have stopped)";
  for (const std::string& w : why) message += "; " + w;
  message += ". The backend said: " + said;
  return DistributedError(message, failed);
}

std::string Group::await(const std::string& key, int from, const std::string& during,
                         bool while_alive) {
  // While `from` is alive (rank 0 may be profiling), when `while_alive`: a timeout without a
  // heartbeat. Else within the timeout: a rank that is alive but elsewhere (another call)
  // must not hold this one forever. A failure another rank reported ends the wait at once.
  const auto started = Clock::now();
  auto last_progress = started;
  bool beating = false;  // `from`'s heartbeat moved while this rank waited
  std::int64_t last_beat = -1;
  // A rank whose heartbeat, once started, has not moved for 10 beats (at least 2 s) is gone:
  // its heartbeat thread runs whatever its main thread does, so silence means the process was
  // killed or stopped (with the default timeout of 5 minutes, a killed rank is named after 10
  // s, not 5 minutes). A rank not yet beating gets the whole timeout.
  const auto silence_limit = std::min<Clock::duration>(
      timeout_, std::max<Clock::duration>(heartbeat_interval_ * 10, std::chrono::seconds(2)));
  try {
    while (!store_->check({key})) {
      if (env_) {
        const std::int64_t beat = heartbeat_of(*store_, from);
        if (beat != last_beat) {
          beating = beating || last_beat >= 0;
          last_beat = beat;
          last_progress = Clock::now();
        }
      }
      // A rank may publish the key and report a failure between this loop's check of the key
      // and this one (check_same's rank 0, finding the ranks differ): what it published first
      // is taken, so that every rank gives the same verdict, not some a lost rank.
      if (any_failure_reported()) {
        if (store_->check({key})) break;
        throw std::runtime_error("another rank reported a failure");
      }
      // The same for a rank that left the job (its heartbeat stopped with it). A rank reports
      // its failure before it leaves: one seen leaving has its report, if any, seen too, even
      // when both came between the check of failures above and this one.
      if (store_->check({fmt::format("left/{}", from)})) {
        if (store_->check({key})) break;
        if (any_failure_reported()) throw std::runtime_error("another rank reported a failure");
        failed_ = true;
        throw DistributedError(
            fmt::format("rank {}: {}: rank {} left the job without getting here (it ended, or "
                        "gave up on an error it did not report)",
                        rank_, during, from),
            {from});
      }
      const bool late = !while_alive && Clock::now() - started > timeout_;
      const auto silent_for = Clock::now() - last_progress;
      if (late || silent_for > timeout_ || (last_beat > 0 && silent_for > silence_limit)) {
        failed_ = true;
        std::string why;
        if (late)
          why = fmt::format("rank {} did not get there within {} ms{}", from, timeout_.count(),
                            beating ? " (it is running: slower than the timeout, or doing "
                                      "something else)"
                                    : "");
        else if (env_)
          why = stopped_answering(from);
        else
          why = fmt::format("nothing came from rank {} within {} ms", from, timeout_.count());
        failed_ranks_.push_back(from);  // leave() does not wait for it
        throw DistributedError(fmt::format("rank {}: {}: {}", rank_, during, why), {from});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return text_of(store_->get(key));
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& error) {  // the store is gone, or a rank failed
    throw failure(during, error);
  }
}

void Group::publish(const std::string& key, const std::string& value, const std::string& during) {
  try {
    store_->set(key, bytes_of(value));
  } catch (const std::exception& error) {
    throw failure(during, error);
  }
}

std::string Group::broadcast(const std::string& what, const std::string& value) {
  const std::string name = fmt::format("broadcast/{}", calls_++);
  const std::string during = "waiting for " + what + " from rank 0";
  check_usable(during);
  if (rank_ == 0) {
    publish(name, value, during);
    return value;
  }
  return await(name, 0, during, /*while_alive=*/true);
}

void Group::check_same(const std::string& what, const std::string& value) {
  const std::int64_t call = calls_++;
  const std::string during = "comparing " + what + " between ranks";
  check_usable(during);
  publish(fmt::format("check/{}/{}", call, rank_), value, during);
  std::vector<std::string> values(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r)
    values[static_cast<std::size_t>(r)] =
        r == rank_ ? value : await(fmt::format("check/{}/{}", call, r), r, during, false);
  std::vector<int> differ;
  for (int r = 1; r < size_; ++r)
    if (values[static_cast<std::size_t>(r)] != values[0]) differ.push_back(r);
  if (differ.empty()) return;
  const int r = differ.front();
  const LineDifference d = first_difference(values[0], values[static_cast<std::size_t>(r)]);
  throw InputError(fmt::format(
      "{} differs between ranks: {} {} from rank 0; at line {}, rank {} has '{}' where rank 0 "
      "has '{}'. Every rank must run the same model and chain, with the same settings.",
      what, rank_list(differ), differ.size() == 1 ? "differs" : "differ", d.line, r, d.theirs,
      d.ours));
}

void Group::barrier() {
  // Through the store, not the backend: a rank that reported a failure instead of arriving
  // stops the others at once, naming it, where a collective would wait out the timeout.
  check_usable("a barrier");
  const std::int64_t call = calls_++;
  publish(fmt::format("barrier/{}/{}", call, rank_), "1", "a barrier");
  for (int r = 0; r < size_; ++r)
    if (r != rank_) (void)await(fmt::format("barrier/{}/{}", call, r), r, "a barrier", false);
}

}  // namespace remat::distributed
