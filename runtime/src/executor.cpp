#include "executor.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <unordered_set>

#include "remat/base/check.h"
#include "remat/core/autocast_cache.h"
#include "remat/core/generator_state.h"
#include "remat/profiler/memory_tracker.h"

namespace remat::detail {
namespace {

std::atomic<bool> fuse_backward{true};

// Generator states and buffer snapshots are kept in host memory outside LibTorch's
// allocators: they are bookkeeping, not activations, and must not count against the budget
// (a CPU generator state is 5 KB per stage that draws random numbers).
HostCopy host_generator_state(c10::Device device) {
  UncountedCpuAllocations uncounted;  // the state tensor LibTorch makes on the way
  return HostCopy(generator_state(device));
}

// A tensor's version counter (-1 for an inference tensor, which has none).
std::int64_t version_of(const torch::Tensor& t) { return t.is_inference() ? -1 : t._version(); }

}  // namespace

bool fuse_backward_calls(bool on) { return fuse_backward.exchange(on); }

BufferCopy::BufferCopy(const torch::Tensor& t)
    : impl_(t.unsafeGetTensorImpl()), version_(version_of(t)) {
  if (!t.is_cuda()) {
    host_ = HostCopy(t);
    return;
  }
  pinned_ = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
  pinned_.copy_(t, /*non_blocking=*/true);
}

void BufferCopy::restore_to(const torch::Tensor& t) const {
  if (t.unsafeGetTensorImpl() == impl_ && version_of(t) == version_ &&
      (pinned_.defined() || same_as_on_cpu(t)))
    return;
  // A pinned block freed while a copy from it is in flight is not reused before the copy ends
  // (LibTorch's host allocator records the copy's stream).
  if (pinned_.defined())
    t.copy_(pinned_, /*non_blocking=*/true);
  else
    t.copy_(host_.tensor());
}

Executor::Executor(const std::vector<NamedStage>& stages, const Chain& chain,
                   const Sequence& sequence, c10::Device device, std::shared_ptr<HostPool> pool)
    : stages_(stages),
      sequence_(sequence),
      device_(device),
      length_(static_cast<int>(stages.size())),
      pool_(std::move(pool)) {
  REMAT_INTERNAL_ASSERT(chain.length() == length_,
                        "the runtime's chain and network differ in length");
  const auto n = static_cast<std::size_t>(length_) + 1;
  for (const Op& op : sequence) copies_ = copies_ || op.is_copy();
  if (copies_) {
    if (!pool_) pool_ = std::make_shared<HostPool>();
    on_host_.resize(n);
    if (device_.is_cuda()) {
      const c10::impl::VirtualGuardImpl impl(device_.type());
      to_host_ = impl.getStreamFromGlobalPool(device_);
      to_device_ = impl.getStreamFromGlobalPool(device_);
    }
  }
  for (int k = 0; k <= length_; ++k) members_.push_back(chain.members(k));
  lifetimes_ = value_lifetimes(sequence, length_);
  x_.resize(n);
  fe_edge_.resize(n);
  fe_sink_.resize(n);
  y_.resize(n);
  ran_.assign(n, false);
  cpu_rng_.resize(n);
  cuda_rng_.resize(n);
  buffer_snapshot_.resize(n);
  entry_buffers_.resize(n);
  restore_after_backward_.assign(n, false);
  recomputed_.assign(n, false);
  first_outputs_.resize(n);
  std::vector<int> forwards(n, 0);
  for (const Op& op : sequence)
    if (op.is_forward())
      recomputed_[static_cast<std::size_t>(op.stage)] =
          ++forwards[static_cast<std::size_t>(op.stage)] > 1;
  freezers_.resize(n);
  for (int k = 0; k < length_; ++k)
    if (recomputed_[static_cast<std::size_t>(k)])
      freezers_[static_cast<std::size_t>(k)] = stages_[static_cast<std::size_t>(k)].module->norm_freezer();
  loss_index_ = sequence.size();
  for (std::size_t k = 0; k < sequence.size(); ++k)
    if (sequence[k].kind == OpKind::kLoss) loss_index_ = k;
  REMAT_INTERNAL_ASSERT(loss_index_ != sequence.size(),
                        "the runtime's sequence has no loss operation");
  const bool fuse = fuse_backward.load();
  backward_end_.assign(sequence.size(), 0);
  for (std::size_t k = sequence.size(); k-- > 0;) {
    backward_end_[k] = k;
    const Op& op = sequence[k];
    if (!fuse || op.kind != OpKind::kBackward || op.stage == 0 || k + 1 == sequence.size())
      continue;
    const Op& next = sequence[k + 1];
    if (next.kind == OpKind::kBackward && next.stage == op.stage - 1 &&
        !chain.carries_gradient(op.stage + 1) && !chain.carries_gradient(op.stage))
      backward_end_[k] = backward_end_[k + 1];
  }
}

const Tensors& Executor::input_of(int i) const {
  const auto ui = static_cast<std::size_t>(i);
  REMAT_INTERNAL_ASSERT(!x_[ui].empty(), "the input of stage ", i, " is not in memory");
  return x_[ui];
}

void Executor::drop_values(std::size_t index) {
  const Op& op = sequence_[index];
  const auto input = static_cast<std::size_t>(op.kind == OpKind::kLoss ? length_ : op.stage);
  if (input > 0 && !lifetimes_.keep_input[index]) x_[input].clear();
  if (op.is_forward() && !lifetimes_.keep_output[index]) x_[input + 1].clear();
}

std::string Executor::failed_in(int i) const {
  const auto ui = static_cast<std::size_t>(i);
  return "in stage " + std::to_string(i) + " (" + stages_[ui].name + ") of remat's chain, " +
         (ran_[ui] ? "recomputed during the backward" : "in the forward");
}

Tensors Executor::call(int i, const Tensors& x) {
  const auto ui = static_cast<std::size_t>(i);
  const NamedStage& stage = stages_[ui];
  Tensors out;
  try {
    const detail::ForwardCastCache casts;
    out = stage.module->forward(x, context_);
  } catch (c10::Error& error) {
    error.add_context(failed_in(i));
    throw;
  } catch (...) {
    stage.module->add_note(std::current_exception(), failed_in(i));
    throw;
  }
  // The schedule was computed for the members the chain describes: a stage that returns
  // others would run outside the budget (or lose a gradient).
  const std::vector<Member>& members = members_[ui + 1];
  const auto refuse = [&](const std::string& what) {
    TORCH_CHECK_VALUE(false, "remat runtime: stage ", i, " (", stage.name, ") ", what,
                      " than its chain says: was the chain measured on this network?");
  };
  if (out.size() != members.size())
    refuse("returned " + std::to_string(out.size()) + " tensors, " +
           std::to_string(members.size()) + " expected; other members");
  for (std::size_t o = 0; o < out.size(); ++o) {
    const int k = members[o].carried_from;
    if (!out[o].defined())
      refuse("returned an undefined tensor as member " + std::to_string(o) + ", other members");
    if (k >= 0 && !out[o].is_same(x[static_cast<std::size_t>(k)]))
      refuse("did not pass input member " + std::to_string(k) + " on as member " +
             std::to_string(o) + ": other members");
  }
  if (recomputed_[ui]) check_recomputed_outputs(i, out);
  return out;
}

void Executor::check_recomputed_outputs(int i, const Tensors& out) {
  const auto ui = static_cast<std::size_t>(i);
  std::vector<OutputShape>& first = first_outputs_[ui];
  if (!ran_[ui]) {
    first.clear();
    for (const torch::Tensor& t : out)
      first.push_back({t.sizes().vec(), t.scalar_type(), t.device()});
    return;
  }
  for (std::size_t o = 0; o < out.size(); ++o) {
    const torch::Tensor& t = out[o];
    const OutputShape& was = first[o];
    if (t.sizes() == c10::IntArrayRef(was.sizes) && t.scalar_type() == was.dtype &&
        t.device() == was.device)
      continue;
    TORCH_CHECK_VALUE(false, "remat runtime: stage ", i, " (", stages_[ui].name,
                      ") returned output member ", o, " as ", t.scalar_type(), " ", t.sizes(),
                      " on ", t.device(), " when recomputed during the backward, but as ",
                      was.dtype, " ", c10::IntArrayRef(was.sizes), " on ", was.device,
                      " in the step's forward. remat runs a stage again to recompute its "
                      "output, and needs the same output each time: a stage whose output "
                      "depends on how often it was called, on the clock, or on random numbers "
                      "not drawn from torch's generators cannot be recomputed");
  }
}

void Executor::before_forward(int i) {
  const auto ui = static_cast<std::size_t>(i);
  if (!ran_[ui]) {
    // Only a stage that the sequence runs again needs its random state (store-all: none).
    if (!recomputed_[ui]) return;
    cpu_rng_[ui] = host_generator_state(c10::Device(c10::kCPU));
    if (device_.is_cuda()) cuda_rng_[ui] = host_generator_state(device_);
    if (freezers_[ui]) return;  // frozen in its recomputations instead
    torch::NoGradGuard no_grad;
    for (const auto& b : stages_[ui].module->buffers()) entry_buffers_[ui].emplace_back(b);
    return;
  }
  if (!cpu_rng_[ui].empty()) {
    caller_cpu_rng_ = host_generator_state(c10::Device(c10::kCPU));
    set_generator_state(c10::Device(c10::kCPU), cpu_rng_[ui].tensor());
  }
  if (!cuda_rng_[ui].empty()) {
    caller_cuda_rng_ = host_generator_state(device_);
    set_generator_state(device_, cuda_rng_[ui].tensor());
  }
  if (freezers_[ui]) {
    REMAT_INTERNAL_ASSERT(!thaw_, "stage ", i, " recomputed while BatchNorms are frozen");
    thaw_ = freezers_[ui]();
    return;
  }
  torch::NoGradGuard no_grad;
  const auto buffers = stages_[ui].module->buffers();
  if (buffer_snapshot_[ui].empty())
    for (const auto& b : buffers) buffer_snapshot_[ui].emplace_back(b);
  // The recomputation reads the buffers the first forward read; restore_buffers puts back
  // what that forward left.
  for (std::size_t k = 0; k < entry_buffers_[ui].size(); ++k)
    entry_buffers_[ui][k].restore_to(buffers[k]);
}

void Executor::after_forward(int i, bool keeps_graph) {
  const auto ui = static_cast<std::size_t>(i);
  if (!ran_[ui]) {
    // The stage's first forward: keep its generator states only if it drew random numbers
    // (each is a few kilobytes of memory per stage, held until the step's backward ends).
    ran_[ui] = true;
    if (!recomputed_[ui]) return;
    if (cpu_rng_[ui] == host_generator_state(c10::Device(c10::kCPU))) cpu_rng_[ui] = HostCopy();
    if (!cuda_rng_[ui].empty() && cuda_rng_[ui] == host_generator_state(device_)) cuda_rng_[ui] = HostCopy();
    // Buffers the forward left as they were need no restoring before a recomputation (found
    // out on the CPU only: on a GPU, reading them would wait for it).
    if (device_.is_cuda()) return;
    const auto buffers = stages_[ui].module->buffers();
    bool changed = false;
    for (std::size_t k = 0; k < entry_buffers_[ui].size() && !changed; ++k)
      changed = !entry_buffers_[ui][k].same_as_on_cpu(buffers[k]);
    if (!changed) entry_buffers_[ui].clear();
    return;
  }
  if (!caller_cpu_rng_.empty()) set_generator_state(c10::Device(c10::kCPU), caller_cpu_rng_.tensor());
  if (!caller_cuda_rng_.empty()) set_generator_state(device_, caller_cuda_rng_.tensor());
  caller_cpu_rng_ = HostCopy();
  caller_cuda_rng_ = HostCopy();
  thaw_norms();
  if (keeps_graph)
    restore_after_backward_[ui] = true;  // autograd saved the buffers: after B_i
  else
    restore_buffers(i);
}

void Executor::thaw_norms() noexcept {
  if (!thaw_) return;
  std::function<void()> thaw = std::move(thaw_);
  thaw_ = nullptr;
  try {
    thaw();
  } catch (...) {
    // Setting host-side values back does not throw (a Python stage's could, in principle: the
    // error being reported, if any, is the one to keep).
  }
}

void Executor::restore_buffers(int i) {
  const auto ui = static_cast<std::size_t>(i);
  if (buffer_snapshot_[ui].empty()) return;
  torch::NoGradGuard no_grad;
  const auto buffers = stages_[ui].module->buffers();
  for (std::size_t k = 0; k < buffers.size(); ++k) buffer_snapshot_[ui][k].restore_to(buffers[k]);
  buffer_snapshot_[ui].clear();
  restore_after_backward_[ui] = false;
}

std::size_t Executor::run(std::size_t index) {
  const Op& op = sequence_[index];
  const int i = op.stage;
  const auto ui = static_cast<std::size_t>(i);
  // A recomputation (after the loss) runs under the autocast state of the step's forward,
  // whatever the caller's state during its backward.
  std::optional<AutocastGuard> autocast;
  if (op.is_forward() && index > loss_index_ && (autocast_.any() || AutocastState::capture().any()))
    autocast.emplace(autocast_);
  // The first read of a prefetched x_i waits for its copy back.
  if (copies_ && op.kind != OpKind::kBackward && !op.is_copy())
    arrive(op.kind == OpKind::kLoss ? length_ : i);
  switch (op.kind) {
    case OpKind::kForwardGrad: {
      before_forward(i);
      torch::AutoGradMode grad(true);
      // The stage's input members: each value's storage under a new tensor whose grad_fn is a
      // sink for its gradient. Not a leaf: a leaf's gradient accumulator would keep the input
      // alive for as long as the graph, whether its backward needs it or not. A member gets a
      // gradient only if the chain says so (for x_0: if the caller's input wants one; plain
      // autograd skips the first stage's input gradient otherwise, and so do we).
      const Tensors& values = input_of(i);
      const std::vector<Member>& in_members = members_[ui];
      Tensors in;
      fe_sink_[ui].clear();
      for (std::size_t k = 0; k < values.size(); ++k) {
        const bool gradient = i > 0 ? in_members[k].grad : input_requires_grad_[k];
        StageInput input = stage_input(values[k], gradient);
        in.push_back(std::move(input.tensor));
        fe_sink_[ui].push_back(std::move(input.sink));
      }
      Tensors out = call(i, in);
      in.clear();
      const std::vector<Member>& out_members = members_[ui + 1];
      Tensors next(out.size());
      fe_edge_[ui].assign(out.size(), torch::autograd::Edge());
      for (std::size_t o = 0; o < out.size(); ++o) {
        const int k = out_members[o].carried_from;
        if (k >= 0) {
          next[o] =
              values[static_cast<std::size_t>(k)];  // the same value: its gradient is passed on
          continue;
        }
        // A gradient the chain does not know of would be dropped, and the parameters behind it
        // would get none: a parameter unfrozen after measuring.
        TORCH_CHECK_VALUE(!out[o].requires_grad() || out_members[o].grad, "remat runtime: stage ",
                          i, " (", stages_[ui].name, ") output member ", o,
                          " requires grad, but it did not when the chain was measured (a "
                          "parameter's requires_grad set after measure()?): its gradient would "
                          "be lost; measure() again");
        if (out[o].requires_grad()) fe_edge_[ui][o] = torch::autograd::impl::gradient_edge(out[o]);
        next[o] = out[o].detach();
      }
      out.clear();
      x_[ui + 1] = std::move(next);
      after_forward(i, true);
      break;
    }
    case OpKind::kForwardNoGrad:
    case OpKind::kForwardCheckpoint: {
      before_forward(i);
      Tensors out;
      {
        torch::NoGradGuard no_grad;
        out = call(i, input_of(i));
      }
      x_[ui + 1] = std::move(out);
      after_forward(i, false);
      break;
    }
    case OpKind::kLoss: {
      const auto ul = static_cast<std::size_t>(length_);
      REMAT_INTERNAL_ASSERT(!x_[ul].empty(), "the chain's output is not in memory at the loss");
      // New tensors on the same storages: the caller's graph attaches to them, not to values
      // that a later forward may read.
      output_.clear();
      for (const torch::Tensor& t : x_[ul]) output_.push_back(t.detach());
      break;
    }
    case OpKind::kBackward: {
      const std::size_t last = backward_end_[index];
      backward(index, last);
      for (std::size_t k = index; k <= last; ++k) drop_values(k);
      return last;
    }
    case OpKind::kOffload:
      offload(i);
      break;
    case OpKind::kEvict:
      evict(i);
      break;
    case OpKind::kPrefetch:
      prefetch(i);
      break;
  }
  drop_values(index);
  return index;
}

namespace {

// The current stream of `device`: the step's compute stream.
c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

// An event recorded on `stream` now.
std::shared_ptr<c10::Event> record_on(const c10::Stream& stream) {
  auto event = std::make_shared<c10::Event>(stream.device_type());
  event->record(stream);
  return event;
}

// A storage's bytes as a uint8 tensor on its device (no allocation).
torch::Tensor storage_bytes(const c10::Storage& storage, c10::Device device) {
  const auto bytes = static_cast<std::int64_t>(storage.nbytes());
  return torch::empty({0}, torch::TensorOptions().dtype(torch::kByte).device(device))
      .set_(storage, 0, {bytes}, {1});
}

}  // namespace

void Executor::offload(int k) {
  const auto uk = static_cast<std::size_t>(k);
  OnHost& h = on_host_[uk];
  REMAT_INTERNAL_ASSERT(!h.evicting && (h.blocks.empty() || h.returned), "O_", k, " while x_", k,
                        " has a copy in host memory");
  const Tensors& values = input_of(k);
  // A copy back not read yet: written over once that copy has ended (the blocks are given back
  // and taken again; the copy out waits for their last copy).
  if (h.copied_back && to_host_) h.copied_back->block(*to_host_);
  for (HostPool::Lease& block : h.blocks) pool_->give_back(std::move(block));
  h.blocks.clear();
  h.returned = false;
  // One block per distinct storage of the members (a member may share another's storage, or
  // view part of one): the whole storage goes, so that the same views come back.
  std::vector<c10::Storage> storages;
  h.members.clear();
  for (const torch::Tensor& t : values) {
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    std::size_t s = 0;
    while (s < storages.size() && storages[s].unsafeGetStorageImpl() != impl) ++s;
    if (s == storages.size()) storages.push_back(t.storage());
    h.members.push_back({s, t.storage_offset(), t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  }
  // On a GPU the copies start once the compute stream has made x_k.
  if (to_host_) record_on(current_stream(device_))->block(*to_host_);
  for (const c10::Storage& storage : storages) {
    const auto bytes = static_cast<std::int64_t>(storage.nbytes());
    HostPool::Lease block = pool_->take(bytes, to_host_.has_value());
    const torch::Tensor source = storage_bytes(storage, device_);
    if (to_host_) {
      if (block->last_copy) block->last_copy->block(*to_host_);
      const c10::StreamGuard on_copy_stream(*to_host_);
      block->bytes(bytes).copy_(source, /*non_blocking=*/true);
    } else {
      block->bytes(bytes).copy_(source);
    }
    h.blocks.push_back(std::move(block));
  }
  if (to_host_) {
    h.copied_out = record_on(*to_host_);
    for (HostPool::Lease& block : h.blocks) block->last_copy = h.copied_out;
  }
  h.evicting = true;
}

void Executor::evict(int k) {
  const auto uk = static_cast<std::size_t>(k);
  OnHost& h = on_host_[uk];
  REMAT_INTERNAL_ASSERT(h.evicting, "E_", k, " without O_", k);
  // The compute stream waits for the copy out, then x_k's storages go: what reuses their memory
  // runs after it.
  if (h.copied_out) h.copied_out->block(current_stream(device_));
  h.copied_out.reset();
  x_[uk].clear();
  h.evicting = false;
}

void Executor::prefetch(int k) {
  const auto uk = static_cast<std::size_t>(k);
  OnHost& h = on_host_[uk];
  REMAT_INTERNAL_ASSERT(!h.evicting && !h.blocks.empty() && !h.returned && x_[uk].empty(), "P_",
                        k, " without x_", k, " evicted to host memory");
  // The new storages are the compute stream's: on a GPU their copy starts where P_k stands in
  // that stream (what the allocator reused their memory from has run).
  if (to_device_) record_on(current_stream(device_))->block(*to_device_);
  std::vector<c10::Storage> storages;
  for (const HostPool::Lease& block : h.blocks) {
    torch::Tensor target =
        torch::empty({block->used}, torch::TensorOptions().dtype(torch::kByte).device(device_));
    if (to_device_) {
      if (block->last_copy) block->last_copy->block(*to_device_);
      const c10::StreamGuard on_copy_stream(*to_device_);
      target.copy_(block->bytes(block->used), /*non_blocking=*/true);
    } else {
      target.copy_(block->bytes(block->used));
    }
    storages.push_back(target.storage());
  }
  if (to_device_) {
    h.copied_back = record_on(*to_device_);
    for (HostPool::Lease& block : h.blocks) block->last_copy = h.copied_back;
  }
  Tensors values;
  for (const MemberLayout& m : h.members)
    values.push_back(torch::empty({0}, torch::TensorOptions().dtype(m.dtype).device(device_))
                         .set_(storages[m.storage], m.offset, m.sizes, m.strides));
  x_[uk] = std::move(values);
  h.returned = true;
}

void Executor::arrive(int k) {
  OnHost& h = on_host_[static_cast<std::size_t>(k)];
  if (!h.returned) return;
  if (h.copied_back) h.copied_back->block(current_stream(device_));
  for (HostPool::Lease& block : h.blocks) pool_->give_back(std::move(block));
  h.blocks.clear();
  h.returned = false;
  h.copied_back.reset();
}

void Executor::release_copies() noexcept {
  if (!copies_) return;
  try {
    // Nothing is given back, nor freed on the device, while a copy from or into it runs.
    if (to_host_) to_host_->synchronize();
    if (to_device_) to_device_->synchronize();
  } catch (...) {
    // A GPU that fails here has failed the step already: that error is the one reported.
  }
  for (OnHost& h : on_host_) {
    for (HostPool::Lease& block : h.blocks) pool_->give_back(std::move(block));
    h = OnHost();
  }
}

Executor::~Executor() { release_copies(); }

void Executor::backward(std::size_t first, std::size_t last) {
  const int top = sequence_[first].stage;
  const int bottom = sequence_[last].stage;
  REMAT_INTERNAL_ASSERT(top - bottom == static_cast<int>(last - first),
                        "the runtime's fused backward is not one of consecutive stages");
  const auto ui = static_cast<std::size_t>(top);
  Tensors& grad_out = y_[ui + 1];
  REMAT_INTERNAL_ASSERT(!grad_out.empty(), "B_", top, " without its output's gradient");
  std::vector<torch::autograd::Edge> edges = std::move(fe_edge_[ui]);
  fe_edge_[ui].clear();
  const std::vector<Member>& out_members = members_[ui + 1];
  // Carried members' gradients are passed on; the others go into the stage's graph, which
  // frees each once used.
  Tensors carried(members_[ui].size());
  std::vector<torch::autograd::Edge> roots;
  Tensors root_grads;
  for (std::size_t o = 0; o < out_members.size(); ++o) {
    const int k = out_members[o].carried_from;
    if (k >= 0) {
      carried[static_cast<std::size_t>(k)] = std::move(grad_out[o]);
    } else if (o < edges.size() && edges[o].is_valid() && grad_out[o].defined()) {
      roots.push_back(std::move(edges[o]));
      root_grads.push_back(std::move(grad_out[o]));
    }
  }
  grad_out.clear();
  edges.clear();  // a graph no gradient reaches is freed here
  // Fused: each stage's input sinks pass their gradients on to the graph of the stage below.
  REMAT_INTERNAL_ASSERT(
      top == bottom || std::none_of(carried.begin(), carried.end(),
                                    [](const torch::Tensor& t) { return t.defined(); }),
      "B_", top, " fused with B_", top - 1, " has a carried gradient");
  for (int k = top; k > bottom; --k) {
    const auto uk = static_cast<std::size_t>(k);
    // No backward reads x_k's values (the graph keeps what it needs): they went after the
    // stage's last forward, and nothing of them may be held until the call ends.
    x_[uk].clear();
    std::vector<torch::autograd::Edge> below = std::move(fe_edge_[uk - 1]);
    fe_edge_[uk - 1].clear();
    std::vector<NodePtr<GradientSink>> sinks = std::move(fe_sink_[uk]);
    fe_sink_[uk].clear();
    for (std::size_t m = 0; m < sinks.size(); ++m)
      if (sinks[m])
        sinks[m]->pass_to(m < below.size() ? std::move(below[m]) : torch::autograd::Edge());
    // The edges of members without a sink (no gradient comes) are freed here, and a sink no
    // node reaches.
  }
  const auto ub = static_cast<std::size_t>(bottom);
  if (top != bottom) carried = Tensors(members_[ub].size());  // none, as asserted above
  std::vector<NodePtr<GradientSink>> sinks = std::move(fe_sink_[ub]);
  fe_sink_[ub].clear();
  // A carried member's passed gradient enters the engine first, at the sink of the input it
  // carries: the stage's own contributions then add to it one by one as they arrive, grouped as
  // plain autograd groups them (there the later stages' contributions reach the input first).
  // Summed apart, (passed + (a + b)), a member the stage reads twice would differ in the last
  // bits (tests/python/test_random_chains.py).
  for (std::size_t k = 0; k < carried.size(); ++k) {
    if (!carried[k].defined() || k >= sinks.size() || !sinks[k]) continue;
    roots.emplace_back(sinks[k], 0);
    root_grads.push_back(std::move(carried[k]));
    carried[k] = torch::Tensor();  // its sink gets the sum
  }
  if (!capturing_) {
    detail::run_backward(std::move(roots), std::move(root_grads));
  } else {
    // The input members' sinks, then the wanted parameters of the call's stages (each once).
    std::vector<torch::autograd::Edge> capture;
    for (std::size_t k = 0; k < sinks.size(); ++k)
      if (sinks[k]) capture.emplace_back(sinks[k], 0);
    const std::size_t sink_count = capture.size();
    std::vector<std::size_t> slots;
    std::unordered_set<std::size_t> seen;
    for (int k = bottom; k <= top; ++k)
      for (const torch::Tensor& p : stages_[static_cast<std::size_t>(k)].module->parameters()) {
        const auto found = wanted_.find(p.unsafeGetTensorImpl());
        if (found == wanted_.end() || !seen.insert(found->second).second) continue;
        capture.push_back(torch::autograd::impl::gradient_edge(p));
        slots.push_back(found->second);
      }
    Tensors got = detail::run_backward_capturing(std::move(roots), std::move(root_grads), capture);
    std::size_t next = 0;
    for (std::size_t k = 0; k < sinks.size(); ++k)
      if (sinks[k]) sinks[k]->gradient = std::move(got[next++]);
    for (std::size_t j = 0; j < slots.size(); ++j) {
      torch::Tensor& gradient = got[sink_count + j];
      if (!gradient.defined()) continue;
      torch::Tensor& sum = captured_[slots[j]];
      sum = sum.defined() ? sum + gradient : std::move(gradient);
    }
  }
  // Each member's gradient from its sink (a carried one's: the sum, in what storage the engine
  // left it), or a passed one as it came where the input has no sink.
  Tensors grad_in(members_[ub].size());
  for (std::size_t k = 0; k < grad_in.size(); ++k) {
    torch::Tensor own =
        k < sinks.size() && sinks[k] ? std::move(sinks[k]->gradient) : torch::Tensor();
    grad_in[k] = carried[k].defined() ? std::move(carried[k]) : compact_gradient(std::move(own));
  }
  sinks.clear();
  y_[ub] = std::move(grad_in);
  for (int k = bottom; k <= top; ++k)
    if (restore_after_backward_[static_cast<std::size_t>(k)]) restore_buffers(k);
}

void Executor::check_versions() const {
  for (const Watched& w : watched_) {
    if (w.tensor._version() == w.version) continue;
    std::string name;
    if (w.stage == -1)
      name = x_[0].size() == 1 ? "the input" : "input member " + std::to_string(w.index);
    else if (w.stage == -2)
      name = "context tensor " + std::to_string(w.index);
    else
      name = "stage " + std::to_string(w.stage) + " (" +
             stages_[static_cast<std::size_t>(w.stage)].name + ")'s parameter " +
             std::to_string(w.index);
    TORCH_CHECK(false, "remat runtime: ", name,
                " was modified by an inplace operation between the forward and the backward (it "
                "is at version ",
                w.tensor._version(), "; expected version ", w.version,
                "): the recomputations would read its new values; plain autograd refuses this "
                "backward too");
  }
}

void Executor::abandon() noexcept {
  release_copies();
  thaw_norms();
  try {
    if (!caller_cpu_rng_.empty()) set_generator_state(c10::Device(c10::kCPU), caller_cpu_rng_.tensor());
    if (!caller_cuda_rng_.empty()) set_generator_state(device_, caller_cuda_rng_.tensor());
    for (int i = 0; i < length_; ++i) restore_buffers(i);
  } catch (...) {
    // Restoring from host copies allocates little; if even that fails, the original error
    // is the one to report.
  }
  caller_cpu_rng_ = HostCopy();
  caller_cuda_rng_ = HostCopy();
  for (auto* tensors : {&x_, &y_})
    for (Tensors& t : *tensors) t.clear();
  for (auto& edges : fe_edge_) edges.clear();
  for (auto& sinks : fe_sink_) sinks.clear();
  for (auto& entry : entry_buffers_) entry.clear();
  context_.clear();
  output_.clear();
  watched_.clear();
}

StepRecorder::StepRecorder(c10::Device device, const Sequence& sequence,
                           const Simulation& predicted,
                           std::shared_ptr<std::vector<TracedOperation>> out, bool memory)
    : sequence_(sequence), out_(std::move(out)) {
  // A copy's own time is its engine's; on the compute stream, which the trace follows, O_i and
  // P_i cost what issuing them costs (nothing, to the model), and E_i the wait for its copy out.
  double compute_end = 0;
  for (const OpRecord& record : predicted.trace) {
    predicted_peak_.push_back(record.during.total() - predicted.initial_bytes);
    predicted_after_.push_back(record.live_after_bytes - predicted.initial_bytes);
    if (!record.op.is_copy()) {
      predicted_ms_.push_back(record.end_ms - record.start_ms);
      compute_end = record.end_ms;
    } else {
      predicted_ms_.push_back(record.op.kind == OpKind::kEvict
                                  ? std::max(0.0, record.end_ms - compute_end)
                                  : 0.0);
      if (record.op.kind == OpKind::kEvict) compute_end = std::max(compute_end, record.end_ms);
    }
  }
  operations_.reserve(predicted_ms_.size());
  if (memory) {
    tracker_ = &MemoryTracker::for_device(device);
    memory_.reserve(predicted_ms_.size());
  }
  if (device.is_cuda()) {
    cuda_ = std::make_unique<CudaIntervals>(device.index());
    cuda_->reserve(static_cast<int>(predicted_ms_.size()));  // no event made while timing
  } else {
    clock_.reserve(2 * predicted_ms_.size());
  }
}

StepRecorder::~StepRecorder() = default;

void StepRecorder::begin(std::size_t first) {
  if (tracker_) {
    if (operations_.empty()) base_ = tracker_->live();
    outer_peak_ = std::max(outer_peak_, tracker_->peak());
    tracker_->reset_peak();
  }
  operations_.emplace_back(first, first);
  if (cuda_)
    cuda_->begin();
  else
    clock_.push_back(std::chrono::steady_clock::now());
}

void StepRecorder::end(std::size_t last) {
  operations_.back().second = last;
  if (cuda_)
    cuda_->end();
  else
    clock_.push_back(std::chrono::steady_clock::now());
  // The allocators' statistics are the host's: what the operation's launches allocated, without
  // waiting for the GPU.
  if (tracker_) memory_.emplace_back(tracker_->peak() - base_, tracker_->live() - base_);
}

void StepRecorder::finish() {
  // The time from each mark to the next: operation, gap, operation, ...
  std::vector<double> gaps;
  if (cuda_) {
    gaps = cuda_->gaps_ms();
  } else {
    for (std::size_t k = 1; k < clock_.size(); ++k)
      gaps.push_back(std::chrono::duration<double, std::milli>(clock_[k] - clock_[k - 1]).count());
  }
  REMAT_INTERNAL_ASSERT(gaps.size() + 1 == 2 * operations_.size(), "a traced step has ",
                        gaps.size() + 1, " marks for ", operations_.size(), " operations");
  std::vector<TracedOperation> trace;
  const std::vector<std::string> names = op_strings(sequence_);
  const std::vector<TracedOperation::Kind> kinds = operation_kinds(sequence_);
  double at = 0;
  for (std::size_t k = 0; k < operations_.size(); ++k) {
    TracedOperation op;
    op.first = operations_[k].first;
    op.last = operations_[k].second;
    op.label = names[op.first];
    if (op.last != op.first) op.label += ".." + std::to_string(sequence_[op.last].stage);
    op.kind = kinds[op.first];
    op.start_ms = at;
    op.measured_ms = gaps[2 * k];
    for (std::size_t p = op.first; p <= op.last && p < predicted_ms_.size(); ++p) {
      op.predicted_ms += predicted_ms_[p];
      op.predicted_peak_bytes = p == op.first
                                    ? predicted_peak_[p]
                                    : std::max(op.predicted_peak_bytes, predicted_peak_[p]);
      op.predicted_after_bytes = predicted_after_[p];
    }
    if (k < memory_.size()) {
      op.measured_peak_bytes = memory_[k].first;
      op.measured_after_bytes = memory_[k].second;
    }
    at += op.measured_ms + (2 * k + 1 < gaps.size() ? gaps[2 * k + 1] : 0.0);
    trace.push_back(op);
  }
  if (tracker_) tracker_->raise_peak(std::max(outer_peak_, tracker_->peak()));
  *out_ = std::move(trace);
}

void Executor::run_operations(std::size_t first, std::size_t end) {
  for (std::size_t k = first; k < end;) {
    if (recorder_) recorder_->begin(k);
    const std::size_t last = run(k);
    if (recorder_) recorder_->end(last);
    k = last + 1;
  }
}

Tensors Executor::run_forward(const Tensors& inputs, const Tensors& context,
                              const std::vector<Tensors>& parameters) {
  c10::OptionalDeviceGuard device_guard;
  if (device_.is_cuda()) device_guard.reset_device(device_);
  try {
    input_requires_grad_.clear();
    Tensors values;
    for (const torch::Tensor& input : inputs) {
      input_requires_grad_.push_back(input.requires_grad());
      values.push_back(input.detach());
    }
    x_[0] = std::move(values);
    context_ = context;
    autocast_ = AutocastState::capture();
    watched_.clear();
    const auto watch = [&](const Tensors& tensors, int stage) {
      for (std::size_t k = 0; k < tensors.size(); ++k)
        watched_.push_back({tensors[k], tensors[k]._version(), stage, static_cast<int>(k)});
    };
    watch(x_[0], -1);  // detached from the inputs: they share their version counters
    watch(context, -2);
    for (int i = 0; i < length_; ++i) watch(parameters[static_cast<std::size_t>(i)], i);
    run_operations(0, loss_index_ + 1);
  } catch (...) {
    abandon();
    throw;
  }
  return std::move(output_);
}

void Executor::capture_gradients(Tensors wanted) {
  capturing_ = true;
  captured_ = Tensors(wanted.size());
  for (std::size_t j = 0; j < wanted.size(); ++j)
    if (wanted[j].defined()) wanted_.emplace(wanted[j].unsafeGetTensorImpl(), j);
}

Tensors Executor::run_backward(Tensors grad_outputs) {
  c10::OptionalDeviceGuard device_guard;
  if (device_.is_cuda()) device_guard.reset_device(device_);
  Tensors y0;
  try {
    check_versions();
    y_[static_cast<std::size_t>(length_)] = std::move(grad_outputs);
    run_operations(loss_index_ + 1, sequence_.size());
    y0 = std::move(y_[0]);
    if (recorder_) recorder_->finish();
  } catch (...) {
    abandon();
    throw;
  }
  y_[0].clear();
  x_[0].clear();
  context_.clear();
  watched_.clear();
  return y0;
}

}  // namespace remat::detail
