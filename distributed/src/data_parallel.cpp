#include "remat/distributed/data_parallel.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <utility>

#include "remat/base/check.h"
#include "remat/core/profiling_scope.h"

namespace remat::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string sizes_string(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (std::size_t k = 0; k < sizes.size(); ++k) out += (k ? ", " : "") + std::to_string(sizes[k]);
  return out + "]";
}

// Waits until `done()` (the collectives completed), within the group's timeout, watching for
// a failure another rank reported and for rank 0's store going away: a collective waiting on a
// lost rank does not always fail by itself (Gloo before LibTorch 2.9 waits out its start-up
// timeout). Errors as group.failure(during, ...).
void watch_until(Group& group, const std::function<bool()>& done, const std::string& during) {
  const auto deadline = Clock::now() + group.timeout();
  auto next_look = Clock::now() + std::chrono::milliseconds(100);
  auto pause = std::chrono::microseconds(20);
  while (!done()) {
    const auto now = Clock::now();
    if (now > deadline)
      throw group.failure(during, std::runtime_error(fmt::format("it did not complete within {} ms",
                                                                 group.timeout().count())));
    if (now > next_look) {
      next_look = now + std::chrono::milliseconds(100);
      bool reported = false;
      try {
        reported = group.any_failure_reported();
      } catch (const std::exception& error) {  // the store is gone: rank 0 with it
        throw group.failure(during, error);
      }
      if (reported)
        throw group.failure(during, std::runtime_error("another rank reported a failure"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace

// What the hooks reach: the DataParallel while it lives (the gradient accumulators, and with
// them the hooks, may outlive it).
struct HookTarget {
  std::mutex mutex;
  DataParallel* owner = nullptr;
};

namespace {

class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradientReadyHook(std::shared_ptr<HookTarget> target, std::function<void(DataParallel&)> call)
      : target_(std::move(target)), call_(std::move(call)) {}
  // Whether its DataParallel is alive.
  bool live() const {
    std::lock_guard<std::mutex> lock(target_->mutex);
    return target_->owner != nullptr;
  }
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    std::lock_guard<std::mutex> lock(target_->mutex);
    if (target_->owner != nullptr) call_(*target_->owner);
    return outputs;
  }

 private:
  std::shared_ptr<HookTarget> target_;
  std::function<void(DataParallel&)> call_;
};

}  // namespace

struct DataParallel::Bucket {
  torch::Tensor flat;
  std::vector<std::size_t> parameters;
  int pending = 0;  // parameters not yet ready in this step
  WorkPtr work;
  Clock::time_point launched;
  // When the all-reduce completed (Clock ticks; 0 before), written by the backend's thread.
  std::shared_ptr<std::atomic<Clock::rep>> completed = std::make_shared<std::atomic<Clock::rep>>(0);
  bool done = false;
};

std::string DataParallel::describe(const torch::nn::Module& module) {
  std::ostringstream out;
  for (const auto& p : module.named_parameters(true))
    out << "parameter " << p.key() << ' ' << p.value().dtype() << ' ' << sizes_string(p.value().sizes())
        << (p.value().requires_grad() ? "" : " frozen") << '\n';
  for (const auto& b : module.named_buffers(true))
    out << "buffer " << b.key() << ' ' << b.value().dtype() << ' ' << sizes_string(b.value().sizes())
        << '\n';
  return out.str();
}

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Group> group,
                           const DataParallelOptions& options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  TORCH_CHECK_VALUE(module_ != nullptr && group_ != nullptr, "DataParallel: null module or group");
  TORCH_CHECK_VALUE(options_.bucket_bytes() >= 1, "DataParallel: bucket_bytes must be positive, not ",
                    options_.bucket_bytes());
  group_->check_same("the model (its parameters and buffers)", describe(*module_));
  for (const auto& p : module_->named_parameters(true)) {
    if (!p.value().requires_grad()) continue;
    names_.push_back(p.key());
    parameters_.push_back(p.value());
  }
  // Another DataParallel on these parameters: each backward would fill only one's buckets
  // (the last made), and the other's all-reduce would average stale gradients. The hooks of
  // DataParallels gone are dropped here.
  for (std::size_t k = 0; k < parameters_.size(); ++k) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[k]);
    if (accumulator == nullptr) continue;
    auto& hooks = accumulator->post_hooks();
    bool taken = false;
    hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                               [&](const std::unique_ptr<torch::autograd::FunctionPostHook>& hook) {
                                 const auto* ours =
                                     dynamic_cast<const GradientReadyHook*>(hook.get());
                                 if (ours == nullptr) return false;
                                 if (ours->live()) taken = true;
                                 return !ours->live();
                               }),
                hooks.end());
    if (taken) {
      const std::string message = fmt::format(
          "DataParallel: parameter {} is already trained by another DataParallel, which still "
          "exists: make one DataParallel per module (destroy the first before making another)",
          names_[k]);
      group_->report_failure(message);
      throw InputError(message);
    }
  }
  // Rank 0's values everywhere.
  std::vector<torch::Tensor> state = module_->parameters(true);
  for (const auto& b : module_->buffers(true)) state.push_back(b);
  broadcast_from_rank0(state, "the parameters and buffers");

  // Buckets, in the reverse of parameters() order: a chain's backward finishes its last stage's
  // gradients first.
  const std::size_t n = parameters_.size();
  bucket_of_.assign(n, 0);
  views_.resize(n);
  expected_.assign(n, 0);
  received_.assign(n, 0);
  std::vector<std::vector<std::size_t>> groups;
  std::int64_t bytes = 0;
  for (std::size_t k = n; k-- > 0;) {
    const torch::Tensor& p = parameters_[k];
    const std::int64_t b = static_cast<std::int64_t>(p.numel()) * static_cast<std::int64_t>(p.element_size());
    const bool same_kind = !groups.empty() &&
                           parameters_[groups.back().front()].dtype() == p.dtype() &&
                           parameters_[groups.back().front()].device() == p.device();
    if (!same_kind || bytes + b > options_.bucket_bytes()) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(k);
    bytes += b;
  }
  torch::NoGradGuard no_grad;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto bucket = std::make_unique<Bucket>();
    std::int64_t numel = 0;
    for (std::size_t k : groups[g]) numel += parameters_[k].numel();
    const torch::Tensor& first = parameters_[groups[g].front()];
    bucket->flat = torch::zeros({numel}, first.options().requires_grad(false));
    std::int64_t offset = 0;
    for (std::size_t k : groups[g]) {
      const torch::Tensor& p = parameters_[k];
      // The parameter's place in the bucket, as a tensor of its own on the bucket's storage
      // rather than an autograd view: an optimizer's zero_grad detaches the gradient in place
      // (Optimizer::zero_grad), which LibTorch refuses for a view.
      views_[k] = torch::empty({0}, bucket->flat.options());
      views_[k].set_(bucket->flat.storage(), bucket->flat.storage_offset() + offset, p.sizes());
      offset += p.numel();
      bucket_of_[k] = g;
      adopt_gradient(k);
    }
    bucket->parameters = groups[g];
    buckets_.push_back(std::move(bucket));
  }

  target_ = std::make_shared<HookTarget>();
  target_->owner = this;
  for (std::size_t k = 0; k < n; ++k) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[k]);
    REMAT_INTERNAL_ASSERT(accumulator != nullptr, "no gradient accumulator for ", names_[k]);
    accumulator->add_post_hook(std::make_unique<GradientReadyHook>(
        target_, [k](DataParallel& dp) { dp.on_gradient(k); }));
    accumulators_.push_back(std::move(accumulator));
  }
}

DataParallel::~DataParallel() {
  if (target_) {
    std::lock_guard<std::mutex> lock(target_->mutex);
    target_->owner = nullptr;
  }
  // An all-reduce still in flight writes into the buckets: let it end first, within the
  // timeout. Not after a failure: it may wait for a lost rank, and the group is done (its
  // works keep their tensors alive; the gradients are not to be used).
  if (group_->failed()) return;
  for (auto& bucket : buckets_)
    if (bucket->work) try {
        bucket->work->wait(group_->timeout());
      } catch (...) {
      }
}

std::vector<std::int64_t> DataParallel::bucket_bytes() const {
  std::vector<std::int64_t> out;
  for (const auto& bucket : buckets_)
    out.push_back(static_cast<std::int64_t>(bucket->flat.nbytes()));
  return out;
}

void DataParallel::broadcast_from_rank0(std::vector<torch::Tensor> tensors, const std::string& what) {
  // One broadcast per dtype and device, of the tensors packed into one (a BatchNorm network has
  // hundreds of small buffers: one round trip each would cost more than the gradients' buckets).
  // The packed copy exists only here, after the backward, when the activations are gone.
  torch::NoGradGuard no_grad;
  std::vector<std::vector<torch::Tensor>> groups;
  for (const torch::Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    auto same = std::find_if(groups.begin(), groups.end(), [&](const auto& g) {
      return g.front().dtype() == t.dtype() && g.front().device() == t.device();
    });
    if (same == groups.end())
      groups.push_back({t});
    else
      same->push_back(t);
  }
  try {
    for (const auto& group : groups) {
      std::vector<torch::Tensor> flat_parts;
      for (const torch::Tensor& t : group) flat_parts.push_back(t.detach().reshape({-1}));
      std::vector<at::Tensor> packed{torch::cat(flat_parts)};
      flat_parts.clear();
      const WorkPtr work = group_->collectives().broadcast(packed, 0);
      watch_until(
          *group_, [&] { return work->isCompleted(); }, "copying " + what + " from rank 0");
      work->wait();  // its error, if it failed
      std::int64_t offset = 0;
      for (const torch::Tensor& t : group) {
        torch::Tensor target = t;
        target.copy_(packed[0].narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& error) {
    throw group_->failure("copying " + what + " from rank 0", error);
  }
}

// The parameter's gradient becomes its bucket's view (the values it had copied in).
void DataParallel::adopt_gradient(std::size_t k) {
  torch::NoGradGuard no_grad;
  torch::Tensor& grad = parameters_[k].mutable_grad();
  torch::Tensor& view = views_[k];
  if (grad.defined() && grad.data_ptr() == view.data_ptr() && grad.strides() == view.strides() &&
      grad.sizes() == view.sizes())
    return;
  if (grad.defined())
    view.copy_(grad);
  else
    view.zero_();
  grad = view;
}

DataParallel::NoSync::NoSync(DataParallel& dp) : dp_(dp) { ++dp_.no_sync_; }

DataParallel::NoSync::~NoSync() { --dp_.no_sync_; }

void DataParallel::on_gradient(std::size_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) {
    // Accumulated on this rank only: allowed under no_sync(), and for remat's profiler, which
    // puts the gradients back as they were.
    if (no_sync_.load() > 0 || remat::detail::profiling()) return;
    const std::string message = fmt::format(
        "DataParallel: parameter {} received a gradient from a backward outside "
        "DataParallel::backward() (loss.backward()?), which would not be averaged over the "
        "ranks: each would train a model of its own. Call dp.backward(loss); to accumulate "
        "gradients over several backwards before averaging them, run the others under "
        "dp.no_sync()",
        names_[k]);
    group_->report_failure(message);
    throw InputError(message);
  }
  const int received = ++received_[k];
  if (!learned_) return;
  if (received > expected_[k]) {
    if (failure_.empty())
      failure_ = fmt::format(
          "parameter {} received its gradient {} times in this step, {} in the first: a bucket's "
          "all-reduce may have been launched before its last contribution (DataParallel needs "
          "every step's backward to use the parameters as the first did)",
          names_[k], received, expected_[k]);
    return;
  }
  if (received < expected_[k]) return;
  adopt_gradient(k);
  Bucket& bucket = *buckets_[bucket_of_[k]];
  if (--bucket.pending == 0) launch_ready();
}

void DataParallel::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) launch(next_launch_++);
}

void DataParallel::launch(std::size_t b) {
  Bucket& bucket = *buckets_[b];
  bucket.launched = Clock::now();
  if (in_backward_) ++last_step_.overlapped_buckets;
  try {
    std::vector<at::Tensor> tensors{bucket.flat};
    bucket.work = group_->collectives().allreduce(tensors);
    // The time it completes, for the overlap figures (on the backend's thread).
    bucket.completed->store(0);
    bucket.work->getFuture()->addCallback([completed = bucket.completed](c10::ivalue::Future&) {
      completed->store(Clock::now().time_since_epoch().count());
    });
  } catch (const std::exception& error) {
    if (failure_.empty()) failure_ = "launching a bucket's all-reduce: " + message_of(error);
    bucket.work = WorkPtr();
  }
}

void DataParallel::check_trainable() const {
  std::unordered_set<const c10::TensorImpl*> ours;
  for (const torch::Tensor& p : parameters_) ours.insert(p.unsafeGetTensorImpl());
  for (const auto& p : module_->named_parameters(true)) {
    if (!p.value().requires_grad() || ours.count(p.value().unsafeGetTensorImpl()) > 0) continue;
    const std::string message = fmt::format(
        "DataParallel: parameter {} requires grad but did not when the DataParallel was made "
        "(unfrozen since, or new): its gradient would not be averaged over the ranks. Choose "
        "which parameters train before making the DataParallel, or make a new one (after "
        "destroying this one)",
        p.key());
    group_->report_failure(message);
    throw InputError(message);
  }
}

void DataParallel::backward(const torch::Tensor& loss) {
  const auto start = Clock::now();
  check_trainable();
  try {
    group_->mark_progress(steps_);
  } catch (const DistributedError&) {
    throw;  // the group failed before
  } catch (const std::exception& error) {
    throw group_->failure("starting step " + std::to_string(steps_ + 1), error);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = true;
    in_backward_ = true;
    std::fill(received_.begin(), received_.end(), 0);
    for (auto& bucket : buckets_) {
      bucket->pending = static_cast<int>(bucket->parameters.size());
      bucket->work = WorkPtr();
      bucket->done = false;
    }
    next_launch_ = 0;
    failure_.clear();
    last_step_ = StepTimes();
  }
  try {
    loss.backward();
  } catch (const std::exception& error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      armed_ = false;
      in_backward_ = false;
    }
    group_->report_failure(fmt::format("its backward failed: {}", message_of(error)));
    throw;
  }
  // On a GPU the backward's kernels may still be running when it returns: its end is when they
  // are done on this thread's current stream, which autograd makes wait for them. Not the
  // whole device, where the all-reduces launched during the backward run too.
  bool on_gpu = false;
  for (const auto& bucket : buckets_) {
    if (!bucket->flat.is_cuda()) continue;
    on_gpu = true;
    c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(bucket->flat.device()).synchronize();
  }
  const auto backward_end = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
    in_backward_ = false;
    if (!failure_.empty()) {
      group_->report_failure(failure_);
      throw InputError("DataParallel: " + failure_);
    }
    const bool first = !learned_;
    if (first) {
      expected_ = received_;
      learned_ = true;
    }
    // Parameters that got fewer contributions than in the first step (or none) are ready now,
    // and so is every bucket. In the first step no gradient was adopted during the backward:
    // each is now (one that zero_grad set to None went elsewhere, and would not be averaged).
    for (std::size_t k = 0; k < parameters_.size(); ++k)
      if (first || received_[k] < expected_[k] || expected_[k] == 0) adopt_gradient(k);
    for (auto& bucket : buckets_) bucket->pending = 0;
    launch_ready();
    if (!failure_.empty()) throw group_->failure("the gradients' all-reduce", std::runtime_error(failure_));
  }
  finish();
  const auto end = Clock::now();
  last_step_.backward_ms = ms_between(start, backward_end);
  last_step_.exposed_ms = ms_between(backward_end, end);
  if (on_gpu) {
    // NCCL's work completes its future once the collective is queued on the GPU, not done: the
    // all-reduces' own times are not known (docs/distributed.md, "Benchmark").
    last_step_.all_reduce_ms = std::numeric_limits<double>::quiet_NaN();
    last_step_.hidden_ms = std::numeric_limits<double>::quiet_NaN();
  } else {
    for (auto& bucket : buckets_) {
      const Clock::rep ticks = bucket->completed->load();
      const auto completed =
          ticks == 0 ? end : std::max(Clock::time_point(Clock::duration(ticks)), bucket->launched);
      last_step_.all_reduce_ms += ms_between(bucket->launched, completed);
      last_step_.hidden_ms +=
          std::max(0.0, ms_between(bucket->launched, std::min(completed, backward_end)));
    }
  }
  ++steps_;
}

// Waits for every bucket (watching for ranks that reported an error, and for the timeout),
// then averages.
void DataParallel::finish() {
  const std::string during = "the gradients' all-reduce";
  watch_until(
      *group_,
      [&] {
        for (auto& bucket : buckets_) {
          if (bucket->done) continue;
          if (!bucket->work->isCompleted()) return false;
          try {
            bucket->work->wait();
          } catch (const std::exception& error) {
            throw group_->failure(during, error);
          }
          bucket->done = true;
        }
        return true;
      },
      during);
  if (group_->size() == 1) return;  // the mean of one rank's gradients, its buffers: as they are
  torch::NoGradGuard no_grad;
  const double size = group_->size();
  for (auto& bucket : buckets_) bucket->flat.div_(size);
  if (options_.broadcast_buffers()) broadcast_from_rank0(module_->buffers(true), "the buffers");
}

const Chain& share_chain(CheckpointableImpl& chk, Group& group, const Tensors& inputs,
                         const Tensors& context, const ProfileOptions& profile_options) {
  std::string stages;
  for (const NamedStage& stage : chk.stages()) stages += stage.name + '\n';
  group.check_same("the list of the chain's stages", stages);
  std::string message;
  if (group.rank() == 0) {
    try {
      chk.measure(inputs, context, profile_options);
      message = "chain\n" + chain_to_json(chk.chain());
    } catch (const std::exception& error) {
      message = "error\n" + message_of(error);
      group.broadcast("the chain", message);
      throw;
    }
  }
  message = group.broadcast("the chain", message);
  if (group.rank() != 0) {
    const std::size_t eol = message.find('\n');
    const std::string kind = message.substr(0, eol), body = message.substr(eol + 1);
    if (kind != "chain")
      throw DistributedError(fmt::format("rank {}: rank 0 could not profile the chain: {}",
                                         group.rank(), body),
                             {0});
    chk.set_chain(parse_chain(body, "the chain from rank 0"));
  }
  return chk.chain();
}

const Solution& solve(CheckpointableImpl& chk, Group& group, const SolveOptions& options) {
  group.check_same("the chain", chain_to_json(chk.chain()));
  const Solution& solution = chk.compute_sequence(options);
  std::string schedule = fmt::format("{} peak {} bytes\n", solution.ok() ? "ok" : "infeasible",
                                     solution.peak_bytes);
  for (const std::string& op : op_strings(solution.sequence)) schedule += op + '\n';
  group.check_same("the schedule", schedule);
  return solution;
}

}  // namespace remat::distributed
