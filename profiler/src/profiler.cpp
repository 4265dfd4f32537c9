// The chain profiler. Definitions of what is measured for stage i, whose input x is handed
// over as the runtime hands it (stage_input.h: a copy of x made before the measurement, not a
// leaf, with a sink for its gradient), all in bytes of tensor storage counted by the device's
// MemoryTracker, in its units (counted_bytes: on CUDA each storage is a block of a multiple of
// 512 bytes) (docs/cost-model.md, "Measuring a chain"):
//   output bytes   = counted bytes of the output's storage (of its data when it is a view of x);
//   saved_inputs   = {0} if x's storage outlives our handle on it (the graph saved it), else {};
//   saved_outputs  = {0} if the output's storage outlives our handle on it, else {};
//   state_bytes    = live once our handles are gone - live before the forward, less the kept
//                    output, plus x when the graph let it go;
//   fwd_tmp_bytes  = peak during the forward with autograd - live after it;
//   fwd_nograd_tmp_bytes = peak during the forward without autograd - live after it;
//   bwd_tmp_bytes  = peak during the backward, run from the output's graph edge with a
//                    gradient the engine alone holds, laid out as the next stage's backward
//                    leaves it (remeasure_backwards) - (live before it + x's gradient).
// and, with a loss function, for the chain's output x_L (handed over as the runtime returns it,
// with a sink for its gradient):
//   loss_tmp_bytes = peak during the loss's forward and backward - (live before it + the
//                    bytes of x_L's gradient y_L), our handle on x_L held through the backward,
//                    or dropped once the loss has its value when !output_held.
#include "remat/profiler/profiler.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "detail.h"
#include "remat/base/text.h"
#include "remat/core/autocast_cache.h"
#include "remat/core/generator_state.h"
#include "remat/core/profiling_scope.h"
#include "remat/core/stage_input.h"
#include "remat/solver/solver.h"

namespace remat {
namespace {

using Clock = std::chrono::steady_clock;

std::string describe(int index, const std::string& name) {
  return "stage " + std::to_string(index) + " (" + name + ")";
}

// On a GPU, cuBLAS and cuBLASLt each keep a workspace per thread and stream, allocated through
// the caching allocator at their first use and kept for the life of the process (32 MiB for
// cuBLAS on recent GPUs). A stage's forward runs on this thread, its backward (and a
// recomputation inside it) on autograd's thread for the device. Measured cold, the first stage
// with a matrix product would count a workspace as its temporary memory, which no training
// step allocates again. Made here, before any measurement, they are live before every step, as
// in training. A linear layer with a bias (cuBLASLt where LibTorch uses it, else cuBLAS) runs
// forward here, and forward and backward on autograd's thread.
struct LinearInBackward : torch::autograd::Function<LinearInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const torch::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor& g = grads[0];
    const torch::Tensor w = torch::ones({g.size(1), g.size(1)}, g.options());
    const torch::Tensor b = torch::ones({g.size(1)}, g.options());
    (void)torch::linear(g, w, b);
    return {g};
  }
};

void start_device_libraries(const c10::Device& device) {
  const torch::AutoGradMode grad_mode(true);
  const auto options = torch::TensorOptions().device(device).dtype(torch::kFloat);
  const torch::Tensor x = torch::ones({16, 16}, options).requires_grad_(true);
  const torch::Tensor w = torch::ones({16, 16}, options).requires_grad_(true);
  const torch::Tensor b = torch::ones({16}, options).requires_grad_(true);
  torch::linear(LinearInBackward::apply(x), w, b).sum().backward();
  synchronize(device);
}

// Everything profiling may change, restored by the destructor.
class ModelState {
 public:
  ModelState(const std::vector<NamedStage>& stages, c10::Device device) : device_(device) {
    std::unordered_set<const void*> seen;
    torch::NoGradGuard no_grad;
    for (const NamedStage& stage : stages) {
      modes_.push_back({stage.module, stage.module->training_modes()});
      for (auto& p : stage.module->parameters()) {
        parameters_.insert(p.unsafeGetTensorImpl());
        if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
        const torch::Tensor& grad = p.grad();
        grads_.push_back({p, grad.defined() ? std::optional<torch::Tensor>(grad.clone()) : std::nullopt});
      }
      for (auto& b : stage.module->buffers())
        if (seen.insert(b.unsafeGetTensorImpl()).second) buffers_.push_back({b, b.clone()});
    }
    cpu_rng_ = generator_state(c10::Device(c10::kCPU));
    if (device.is_cuda()) cuda_rng_ = generator_state(device);
  }
  ModelState(const ModelState&) = delete;
  bool has_parameter(const torch::Tensor& t) const {
    return parameters_.count(t.unsafeGetTensorImpl()) > 0;
  }
  ModelState& operator=(const ModelState&) = delete;

  // Gives every parameter that requires grad a gradient (zeros where it had none), so that
  // backward accumulates into existing storage as in training after the first step.
  void allocate_grads() {
    torch::NoGradGuard no_grad;
    for (auto& entry : grads_)
      if (entry.param.requires_grad() && !entry.param.grad().defined())
        entry.param.mutable_grad() = torch::zeros_like(entry.param);
  }

  ~ModelState() {
    // A destructor must not throw. Each part is restored even if another failed: a stage's
    // set_training_modes runs the stage's own code (a Python module's), which may.
    const auto attempt = [](auto&& restore) {
      try {
        restore();
      } catch (...) {
      }
    };
    torch::NoGradGuard no_grad;
    attempt([&] {
      for (auto& entry : grads_) {
        if (entry.grad)
          entry.param.mutable_grad() = *entry.grad;
        else
          entry.param.mutable_grad() = torch::Tensor();
      }
    });
    attempt([&] {
      for (auto& entry : buffers_) entry.buffer.copy_(entry.saved);
    });
    for (auto& entry : modes_) attempt([&] { entry.module->set_training_modes(entry.modes); });
    attempt([&] { set_generator_state(c10::Device(c10::kCPU), cpu_rng_); });
    if (device_.is_cuda()) attempt([&] { set_generator_state(device_, cuda_rng_); });
  }

 private:
  struct ModeEntry {
    std::shared_ptr<StageModule> module;
    std::vector<bool> modes;
  };
  struct GradEntry {
    torch::Tensor param;
    std::optional<torch::Tensor> grad;
  };
  struct BufferEntry {
    torch::Tensor buffer, saved;
  };
  c10::Device device_;
  std::vector<ModeEntry> modes_;
  std::vector<GradEntry> grads_;
  std::vector<BufferEntry> buffers_;
  std::unordered_set<const void*> parameters_;
  torch::Tensor cpu_rng_, cuda_rng_;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Median over repetitions of the time of `timed`, each preceded by an untimed `setup`; a
// repetition runs both `inner` times, `inner` chosen so that it lasts min_repetition_ms of
// wall time, setup included (at most 1000 runs). On
// the CPU, each run of `timed` is timed by the host's clock between synchronizations; on a GPU,
// by events on the stream, the runs back to back with the host never waiting
// (detail::CudaIntervals): what a stage costs within a step, where the host queues work ahead
// of the GPU, the cost of launching its kernels counted only where the GPU waits for it.
template <class Setup, class Timed>
double time_ms(const ProfileOptions& options, c10::Device device, const Setup& setup,
               const Timed& timed) {
  auto run = [&](int count) {
    if (device.is_cuda()) {
      detail::CudaIntervals intervals(device.has_index() ? device.index() : -1);
      intervals.reserve(count);
      for (int k = 0; k < count; ++k) {
        setup();
        intervals.begin();
        timed();
        intervals.end();
      }
      return intervals.total_ms();
    }
    double total = 0;
    for (int k = 0; k < count; ++k) {
      setup();
      synchronize(device);
      const auto start = Clock::now();
      timed();
      synchronize(device);
      total += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    }
    return total;
  };
  // The repetition's length is its wall time, the untimed setup included: a backward whose
  // setup is its stage's forward would otherwise run a thousand forwards a repetition.
  double wall_ms = 0;
  for (int k = 0; k < std::max(1, options.warmup()); ++k) {
    const auto start = Clock::now();
    (void)run(1);
    wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }
  const int inner = static_cast<int>(
      std::clamp(std::ceil(options.min_repetition_ms() / std::max(wall_ms, 1e-3)), 1.0, 1000.0));
  std::vector<double> samples;
  for (int r = 0; r < std::max(1, options.repeat()); ++r) samples.push_back(run(inner) / inner);
  return median(samples);
}

std::string member_name(const Tensors& members, std::size_t k) {
  return members.size() == 1 ? std::string() : " member " + std::to_string(k);
}

// What a tensor is where remat cannot hold it as a member (a sparse, nested or MKL-DNN
// tensor: no one storage to count, save or restore), or nothing.
std::optional<std::string> unsupported_kind(const torch::Tensor& t) {
  if (t.is_nested()) return std::string("a nested tensor");
  if (t.layout() != torch::kStrided)
    return "a tensor of layout " + c10::str(t.layout()) +
           " (sparse and MKL-DNN tensors have no storage of their own to count)";
  return std::nullopt;
}

// Runs a stage, checking what it returns and that it leaves its inputs and the context alone.
struct Runner {
  const NamedStage& stage;
  int index;
  const Tensors& context;

  Tensors operator()(const Tensors& x) const {
    std::vector<std::uint32_t> versions;
    for (const auto* list : {&x, &context})
      for (const torch::Tensor& t : *list) versions.push_back(t._version());
    Tensors out;
    try {
      const detail::ForwardCastCache casts;
      out = stage.module->forward(x, context);
    } catch (const c10::OutOfMemoryError&) {
      throw;  // not the stage's fault: the caller may retry with less
    } catch (const std::exception& error) {
      if (stage.module->interrupts(std::current_exception())) throw;
      std::throw_with_nested(
          ProfileError(describe(index, stage.name) + ": forward failed: " + message_of(error)));
    }
    std::size_t v = 0;
    for (const auto* list : {&x, &context})
      for (std::size_t k = 0; k < list->size(); ++k)
        if ((*list)[k]._version() != versions[v++])
          throw ProfileError(
              describe(index, stage.name) + " modified its " +
              (list == &x ? "input" + member_name(x, k) : "context tensor " + std::to_string(k)) +
              " in place; a stage must not (fold the in-place operation into the "
              "stage before it, or make it out of place)");
    if (out.empty()) throw ProfileError(describe(index, stage.name) + " returned no tensors");
    for (std::size_t o = 0; o < out.size(); ++o) {
      if (!out[o].defined())
        throw ProfileError(describe(index, stage.name) + " returned an undefined tensor" +
                           member_name(out, o));
      if (const auto kind = unsupported_kind(out[o]))
        throw ProfileError(describe(index, stage.name) + " returned " + *kind +
                           member_name(out, o) +
                           ": a stage returns dense (strided) tensors only (make it dense "
                           "inside the stage, or keep it within one stage)");
    }
    return out;
  }
};

// A tensor that requires grad reached by a stage's graph must be a parameter of a stage: an
// undeclared one would keep the gradients of the profiler's backward passes (they are restored
// for parameters only), and its stage's buffers, undeclared as well most likely, would be
// updated again by every recomputation.
void check_declared_leaves(const std::vector<torch::autograd::Edge>& edges, const ModelState& state,
                           int index, const NamedStage& stage) {
  const std::string& name = stage.name;
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<const torch::autograd::Node*> visited;
  for (const torch::autograd::Edge& edge : edges)
    if (edge.function) stack.push_back(edge.function.get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!visited.insert(node).second) continue;
    if (const auto* leaf = dynamic_cast<const torch::autograd::AccumulateGrad*>(node)) {
      const torch::Tensor& t = leaf->variable;
      if (t.defined() && !state.has_parameter(t))
        throw ProfileError(
            describe(index, name) + " uses a tensor that requires grad (" +
            c10::str(t.scalar_type(), " ", t.sizes()) +
            ") that is not a parameter of any stage: its gradient and its module's buffers "
            "would not be the training step's. " + stage.module->undeclared_parameter_advice());
      continue;
    }
    for (const torch::autograd::Edge& next : node->next_edges())
      if (next.function) stack.push_back(next.function.get());
  }
}

bool has_trainable_parameters(const NamedStage& stage) {
  for (const auto& p : stage.module->parameters())
    if (p.requires_grad()) return true;
  return false;
}

bool shares_storage(const torch::Tensor& a, const torch::Tensor& b) {
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

// The input member that output `out` is, returned as it came (carried), or -1.
int carried_from(const Tensors& inputs, const torch::Tensor& out) {
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (out.is_same(inputs[k])) return static_cast<int>(k);
  return -1;
}

// How a gradient is laid out in its storage, where that is not the plain one (contiguous, on
// a storage of its own elements): a permuted gradient (the backward of a permute or of a
// channels-last convolution), or an expanded one (a sum's). The runtime hands a stage's
// backward its output's gradient as the next stage's backward left it (compact_gradient), and
// some backwards take memory by the layout: a reshape's copies a permuted gradient, a
// convolution's makes it contiguous. So each stage's backward is measured from gradients laid
// out as in a step (profile(), "layouts").
struct GradientLayout {
  std::vector<std::int64_t> sizes, strides;
  std::int64_t offset = 0;
  std::int64_t storage_elements = 0;
  std::int64_t storage_bytes = 0;  // its storage's, of storage_elements
  bool operator==(const GradientLayout& other) const {
    return sizes == other.sizes && strides == other.strides && offset == other.offset &&
           storage_elements == other.storage_elements;
  }
};
using Layouts = std::vector<std::optional<GradientLayout>>;  // per member; none: the plain one

std::optional<GradientLayout> layout_of(const torch::Tensor& gradient) {
  if (!gradient.defined()) return std::nullopt;
  const auto elements =
      static_cast<std::int64_t>(gradient.storage().nbytes() / gradient.element_size());
  if (gradient.is_contiguous() && gradient.storage_offset() == 0 && elements == gradient.numel())
    return std::nullopt;
  return GradientLayout{gradient.sizes().vec(), gradient.strides().vec(), gradient.storage_offset(),
                        elements, static_cast<std::int64_t>(gradient.storage().nbytes())};
}

// A gradient of ones of the given shape, laid out as `layout` says (the plain layout if none),
// not a view (as compact_gradient leaves it).
torch::Tensor ones_gradient(const std::vector<std::int64_t>& shape,
                            const torch::TensorOptions& options,
                            const std::optional<GradientLayout>& layout) {
  const torch::TensorOptions plain = options.requires_grad(false);
  if (!layout || layout->sizes != shape) return torch::ones(shape, plain);
  torch::NoGradGuard no_grad;
  const torch::Tensor storage = torch::ones({layout->storage_elements}, plain);
  torch::Tensor gradient = torch::empty({0}, plain);
  gradient.set_(storage.storage(), layout->offset, layout->sizes, layout->strides);
  return gradient;
}

// A copy of a stage's input member, laid out in its own storage as the member is in its: a
// slice of a larger storage (one half of a `chunk`) stays a slice, of a copy of that storage,
// as a step hands it to the stage; a plain clone would make it contiguous, and some backwards
// (a convolution's) copy a slice that they use as it comes when it is contiguous.
torch::Tensor copy_laid_out(const torch::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return t.clone();  // its strides kept
  torch::NoGradGuard no_grad;
  const auto elements = static_cast<std::int64_t>(t.storage().nbytes() / t.element_size());
  torch::Tensor whole = torch::empty({0}, t.options());
  whole.set_(t.storage(), 0, {elements}, {1});
  const torch::Tensor storage = whole.clone();
  torch::Tensor copy = torch::empty({0}, t.options());
  copy.set_(storage.storage(), t.storage_offset(), t.sizes(), t.strides());
  return copy;
}

// Whether member k of x_i is a storage of the chain's input x_0: x_0's own (i = 0), or carried
// on from it by every stage before i.
bool is_input_storage(const Chain& chain, int i, int k) {
  for (; i > 0; --i) {
    const Member& member =
        chain.stages[static_cast<std::size_t>(i) - 1].outputs[static_cast<std::size_t>(k)];
    if (!member.carried()) return false;
    k = member.carried_from;
  }
  return true;
}

// Which input member each output member carries (-1: a new tensor); a member carried twice is
// refused (one storage, but two gradients to add).
std::vector<int> carried_members(const NamedStage& stage, int index, const Tensors& inputs,
                                 const Tensors& outputs) {
  std::vector<int> carried;
  for (const torch::Tensor& out : outputs) {
    const int k = carried_from(inputs, out);
    if (k >= 0 && std::find(carried.begin(), carried.end(), k) != carried.end())
      throw ProfileError(describe(index, stage.name) + " returned its input" +
                         member_name(inputs, static_cast<std::size_t>(k)) +
                         " twice; return it once (or a copy)");
    carried.push_back(k);
  }
  return carried;
}

void check_device(const NamedStage& stage, int index, c10::Device device) {
  for (const auto& p : stage.module->parameters())
    if (p.device() != device)
      throw ProfileError(describe(index, stage.name) + " has parameters on " + p.device().str() +
                         " but the sample is on " + device.str() +
                         ": move the model or the sample so that they agree");
  for (const auto& b : stage.module->buffers())
    if (b.device() != device)
      throw ProfileError(describe(index, stage.name) + " has buffers on " + b.device().str() +
                         " but the sample is on " + device.str());
}

// Timing::kStages for stage `stage` (its outputs already described): each quantity timed
// alone, its runs back to back (time_ms), on copies of the stage's input x handed over as
// leaves; `next` is the stage's output without autograd, for the gradients' shapes.
void time_stage(const Runner& run, const Tensors& x, const Tensors& next,
                const std::vector<Member>& in_members, const ProfileOptions& options,
                c10::Device device, Stage& stage) {
  Tensors timing;
  for (std::size_t k = 0; k < x.size(); ++k)
    timing.push_back(x[k].detach().requires_grad_(in_members[k].grad));
  Tensors kept_out;
  stage.fwd_ms = time_ms(
      options, device, [] {}, [&] { kept_out = run(timing); });
  kept_out.clear();
  {
    torch::NoGradGuard no_grad;
    stage.fwd_nograd_ms = time_ms(
        options, device, [] {}, [&] { kept_out = run(timing); });
    kept_out.clear();
  }
  // The new members with a gradient are the backward's roots.
  std::vector<std::size_t> graded;
  Tensors grads_out;
  for (std::size_t o = 0; o < next.size(); ++o) {
    if (stage.outputs[o].carried() || !stage.outputs[o].grad) continue;
    graded.push_back(o);
    grads_out.push_back(torch::ones_like(next[o], at::MemoryFormat::Contiguous));
  }
  if (!graded.empty()) {
    stage.bwd_ms = time_ms(
        options, device, [&] { kept_out = run(timing); },
        [&] {
          Tensors roots_out;
          for (const std::size_t o : graded) roots_out.push_back(kept_out[o]);
          torch::autograd::backward(roots_out, grads_out);
        });
    kept_out.clear();
  }
}

// The backward of stage `index` from `roots`; a failure is the stage's, named as such (out of
// memory and the stage's own interruptions pass through).
void stage_backward(const NamedStage& named, int index, std::vector<torch::autograd::Edge> roots,
                    Tensors root_grads) {
  try {
    detail::run_backward(std::move(roots), std::move(root_grads));
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const std::exception& error) {
    if (named.module->interrupts(std::current_exception())) throw;
    std::throw_with_nested(
        ProfileError(describe(index, named.name) + ": backward failed: " + message_of(error)));
  }
}

// The unmeasured run of stage `index` before its memory is measured (profile(), warm_up):
// forward with autograd on copies of its input x handed over as the runtime hands them, then
// backward from its new members with a gradient; errors as the measured runs report them.
void warm_up_stage(const Runner& run, const NamedStage& named, int index, const Tensors& x,
                   const std::vector<Member>& in_members, c10::Device device,
                   const Layouts& seeds) {
  Tensors handed;
  std::vector<detail::NodePtr<detail::GradientSink>> sinks;
  for (std::size_t k = 0; k < x.size(); ++k) {
    detail::StageInput input = detail::stage_input(copy_laid_out(x[k]), in_members[k].grad);
    handed.push_back(std::move(input.tensor));
    sinks.push_back(std::move(input.sink));
  }
  std::vector<torch::autograd::Edge> roots;
  Tensors root_grads;
  {
    Tensors out = run(handed);
    for (std::size_t o = 0; o < out.size(); ++o) {
      const torch::Tensor& t = out[o];
      if (!t.requires_grad() || carried_from(handed, t) >= 0) continue;
      roots.push_back(torch::autograd::impl::gradient_edge(t));
      root_grads.push_back(
          ones_gradient(t.sizes().vec(), t.options(), o < seeds.size() ? seeds[o] : std::nullopt));
    }
  }
  handed.clear();
  if (!roots.empty()) stage_backward(named, index, std::move(roots), std::move(root_grads));
  sinks.clear();
  synchronize(device);
}

// Marks on a device's timeline: CUDA events on the current stream (the host never waits for
// them), or the host's clock on the CPU, where a stage's work is done when its call returns.
class Marks {
 public:
  Marks(c10::Device device, std::size_t count) {
    if (device.is_cuda()) {
      events_.emplace(device.has_index() ? device.index() : -1);
      events_->reserve(static_cast<int>((count + 1) / 2));
    } else {
      times_.reserve(count);
    }
  }
  void mark() {
    if (events_)
      events_->begin();
    else
      times_.push_back(Clock::now());
  }
  // The times between consecutive marks, in ms (waiting for the GPU).
  std::vector<double> gaps_ms() {
    if (events_) return events_->gaps_ms();
    std::vector<double> gaps;
    for (std::size_t k = 1; k < times_.size(); ++k)
      gaps.push_back(std::chrono::duration<double, std::milli>(times_[k] - times_[k - 1]).count());
    return gaps;
  }

 private:
  std::optional<detail::CudaIntervals> events_;
  std::vector<Clock::time_point> times_;
};

// Timing::kPasses: each stage's times within whole passes over the chain, as in a training
// step (docs/cost-model.md, "How times are taken"). A pass runs the forward with autograd
// through every stage, keeping their graphs; then the backward in reverse, consecutive stages
// in one engine call as the runtime runs them; then the forward without autograd. One mark at each
// stage's boundary, and no synchronization within a pass: the host runs ahead of the GPU as in a
// step, and a stage costs its share of the GPU's timeline, the launches of its kernels counted only
// where the GPU waits for them. Timed alone, a stage costs the slower of its launches and its
// kernels; within a pass, the host's lead gained over GPU-bound stages hides the launches of the
// host-bound stages after them. Returns false, the chain's times unchanged, out of memory: a pass
// keeps every stage's graph at once.
// With ProfileOptions::max_steps, the passes end once another would take the time spent
// measuring since `started` beyond max_steps of the passes' steps (at least one timed pass); on
// the CPU the memory's measurement, which ran every stage, is the warm-up.
class PassTimer {
 public:
  PassTimer(const std::vector<NamedStage>& stages, const Tensors& inputs, const Tensors& context,
            const ProfileOptions& options, c10::Device device, Chain& chain)
      : inputs_(inputs),
        options_(options),
        device_(device),
        chain_(chain),
        length_(stages.size()),
        // The restart (Chain::restart_ms): the first forward without autograd, stage 0's, comes
        // right after the backward's last engine call; stage 0 runs once more after the last
        // stage, within the pass. On a GPU the engine call returns with the backward's kernels
        // queued, and the GPU then waits for the forward's first launches; on the CPU the
        // backward ran on this thread.
        restart_(device.is_cuda() || options.measure_restart_on_cpu()),
        fwd_(length_),
        bwd_(length_),
        nograd_(length_) {
    // Made once, outside the timed passes: host work there would count as the stages'.
    for (std::size_t i = 0; i < length_; ++i) {
      runs_.push_back(Runner{stages[i], static_cast<int>(i), context});
      members_.push_back(chain.members(static_cast<int>(i)));
    }
  }

  // The warm-up and timed passes; false out of memory (the chain's times unchanged).
  bool run(Clock::time_point started) {
    const bool bounded = options_.max_steps() > 0;
    const int warmup = bounded && !device_.is_cuda() ? 0 : std::max(1, options_.warmup());
    const int repeat = std::max(1, options_.repeat());
    // Marks: start, L forwards, L backwards, start, L forwards without autograd[, Fn_0].
    const std::size_t per_pass = 3 * length_ + 2 + (restart_ ? 1 : 0);
    double step_ms = 0;  // the timed passes' forward and backward, summed over the stages
    try {
      for (int pass = 0; pass < warmup + repeat; ++pass) {
        const auto pass_started = Clock::now();
        Marks marks(device_, per_pass);
        std::vector<Tensors> outs(length_);
        std::vector<std::vector<detail::NodePtr<detail::GradientSink>>> sinks(length_);
        marks.mark();
        forward_pass(marks, outs, sinks);
        backward_pass(marks, outs, sinks);
        nograd_pass(marks);
        // The warm-up passes are queued and waited for like the timed ones; their marks go.
        const std::vector<double> gaps = marks.gaps_ms();
        if (pass < warmup) continue;
        record(gaps);
        if (bounded) {
          for (std::size_t i = 0; i < length_; ++i) step_ms += fwd_[i].back() + bwd_[i].back();
          const int timed = pass + 1 - warmup;
          const auto now = Clock::now();
          const double spent_ms = std::chrono::duration<double, std::milli>(now - started).count();
          const double pass_ms =
              std::chrono::duration<double, std::milli>(now - pass_started).count();
          if (spent_ms + pass_ms > options_.max_steps() * step_ms / timed) break;
        }
      }
    } catch (const c10::OutOfMemoryError&) {
      return false;
    }
    write_times();
    return true;
  }

 private:
  // Gradients of ones, one per shape and type, made in the first pass.
  torch::Tensor ones_like(const torch::Tensor& t) {
    for (const torch::Tensor& g : ones_)
      if (g.sizes() == t.sizes() && g.dtype() == t.dtype()) return g;
    ones_.push_back(torch::ones(t.sizes(), t.options().requires_grad(false)));
    return ones_.back();
  }

  // The forward with autograd through every stage, keeping each one's outputs and input sinks.
  void forward_pass(Marks& marks, std::vector<Tensors>& outs,
                    std::vector<std::vector<detail::NodePtr<detail::GradientSink>>>& sinks) {
    Tensors x = inputs_;
    for (std::size_t i = 0; i < length_; ++i) {
      Tensors handed;
      for (std::size_t k = 0; k < x.size(); ++k) {
        detail::StageInput input = detail::stage_input(x[k], members_[i][k].grad);
        handed.push_back(std::move(input.tensor));
        sinks[i].push_back(std::move(input.sink));
      }
      outs[i] = runs_[i](handed);
      marks.mark();
      x = outs[i];
    }
  }

  // The backward as the runtime runs it (docs/runtime.md, "How a step runs"): consecutive
  // stages in one engine call, each stage's input sinks passing the gradient on to the stage
  // below, cut where a member of x_k is carried through with a gradient (the runtime sums those
  // itself); gradients of ones at the top of each call. A stage's backward ends when the first
  // of its input sinks receives its gradient (stage j, the last of a call: when the call
  // returns), and so do the marks: each made once, in the order of the stages, those of stages
  // no gradient reached when their call returns.
  void backward_pass(Marks& marks, std::vector<Tensors>& outs,
                     std::vector<std::vector<detail::NodePtr<detail::GradientSink>>>& sinks) {
    std::vector<bool> marked(length_, false);
    const auto mark_stage = [&](std::size_t k) {
      if (marked[k]) return;
      marked[k] = true;
      marks.mark();
    };
    for (std::size_t top = length_; top-- > 0;) {
      std::size_t bottom = top;
      while (bottom > 0 && !chain_.carries_gradient(static_cast<int>(bottom))) --bottom;
      std::vector<torch::autograd::Edge> roots;
      Tensors grads;
      for (std::size_t o = 0; o < outs[top].size(); ++o) {
        const Member& member = chain_.stages[top].outputs[o];
        if (member.carried() || !member.grad || !outs[top][o].requires_grad()) continue;
        roots.push_back(torch::autograd::impl::gradient_edge(outs[top][o]));
        grads.push_back(ones_like(outs[top][o]));
      }
      for (std::size_t k = top; k > bottom; --k) {
        for (std::size_t m = 0; m < sinks[k].size(); ++m) {
          if (!sinks[k][m]) continue;
          const torch::Tensor& below = outs[k - 1][m];
          sinks[k][m]->pass_to(below.requires_grad() ? torch::autograd::impl::gradient_edge(below)
                                                     : torch::autograd::Edge());
          sinks[k][m]->on_gradient = [&mark_stage, k] { mark_stage(k); };
        }
      }
      for (std::size_t k = bottom; k <= top; ++k) outs[k].clear();
      detail::run_backward(std::move(roots), std::move(grads));
      for (std::size_t k = top + 1; k-- > bottom;) {
        mark_stage(k);
        sinks[k].clear();
      }
      top = bottom;
    }
  }

  // The forward without autograd, and stage 0 once more for the restart.
  void nograd_pass(Marks& marks) {
    torch::NoGradGuard no_grad;
    marks.mark();
    Tensors x = inputs_;
    for (std::size_t i = 0; i < length_; ++i) {
      Tensors detached;
      for (const torch::Tensor& t : x) detached.push_back(t.detach());
      x = runs_[i](detached);
      marks.mark();
    }
    if (restart_) {
      Tensors detached;
      for (const torch::Tensor& t : inputs_) detached.push_back(t.detach());
      (void)runs_[0](detached);
      marks.mark();
    }
  }

  // One timed pass's times, from the gaps between its marks.
  void record(const std::vector<double>& gaps) {
    for (std::size_t i = 0; i < length_; ++i) {
      fwd_[i].push_back(gaps[i]);
      bwd_[length_ - 1 - i].push_back(gaps[length_ + i]);
      nograd_[i].push_back(gaps[2 * length_ + 1 + i]);
    }
    if (restart_) {
      // From the backward's end to Fn_0's end (the host's work in between included), less
      // Fn_0 within the pass, which is stage 0's time without autograd.
      const double within = gaps[3 * length_ + 1];
      restarts_.push_back(gaps[2 * length_] + gaps[2 * length_ + 1] - within);
      nograd_[0].back() = within;
    }
  }

  // The medians into the chain.
  void write_times() {
    for (std::size_t i = 0; i < length_; ++i) {
      Stage& stage = chain_.stages[i];
      stage.fwd_ms = median(fwd_[i]);
      stage.fwd_nograd_ms = median(nograd_[i]);
      bool graded = false;
      for (const Member& m : stage.outputs) graded = graded || (!m.carried() && m.grad);
      stage.bwd_ms = graded ? median(bwd_[i]) : 0.0;
    }
    chain_.restart_ms = restart_ ? std::max(0.0, median(restarts_)) : 0.0;
  }

  const Tensors& inputs_;
  const ProfileOptions& options_;
  const c10::Device device_;
  Chain& chain_;
  const std::size_t length_;
  const bool restart_;
  std::vector<Runner> runs_;
  std::vector<std::vector<Member>> members_;
  Tensors ones_;
  std::vector<std::vector<double>> fwd_, bwd_, nograd_;
  std::vector<double> restarts_;
};

bool time_in_passes(const std::vector<NamedStage>& stages, const Tensors& inputs,
                    const Tensors& context, const ProfileOptions& options, c10::Device device,
                    Clock::time_point started, Chain& chain) {
  return PassTimer(stages, inputs, context, options, device, chain).run(started);
}

}  // namespace

Timing parse_timing(const std::string& text) {
  if (text == "auto") return Timing::kAuto;
  if (text == "stages") return Timing::kStages;
  if (text == "passes") return Timing::kPasses;
  TORCH_CHECK_VALUE(false, "unknown timing '", text, "': expected auto, stages or passes");
}

const char* timing_name(Timing timing) {
  switch (timing) {
    case Timing::kAuto: return "auto";
    case Timing::kStages: return "stages";
    case Timing::kPasses: return "passes";
  }
  return "?";
}

std::int64_t storage_bytes(const std::vector<torch::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  std::int64_t total = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second)
      total += counted_bytes(t.device(), static_cast<std::int64_t>(t.storage().nbytes()));
  }
  return total;
}

// A member that is a new tensor: its storage's bytes (at least `kept_alive`), and where it has a
// gradient that differs, the gradient's. The runtime keeps a gradient of the member's own
// elements (compact_gradient): more than the storage where the member is expanded (a stride of
// 0), less where it is a slice of a larger storage; a little more where a backward gives it as
// a slice with gaps, found once the backwards are measured (count_kept_gradients).
Member new_member(const torch::Tensor& t, bool grad, std::int64_t kept_alive = 0) {
  Member member{std::max(storage_bytes({t}), kept_alive), grad};
  if (member.grad) {
    const std::int64_t gradient =
        counted_bytes(t.device(), static_cast<std::int64_t>(t.numel()) * t.element_size());
    if (gradient != member.bytes) member.grad_bytes = gradient;
  }
  return member;
}

namespace {

// What profile() is given, checked before any work: counts that would only be refused after
// the work, or never end, tensors it cannot measure, stages without a module or on another
// device, context no stage takes. Returns the step's device.
c10::Device check_profile_arguments(const std::vector<NamedStage>& stages, const Tensors& inputs,
                                    const Tensors& context, const ProfileOptions& options) {
  if (stages.empty()) throw ProfileError("the chain has no stages: nothing to profile");
  if (stages.size() > static_cast<std::size_t>(kMaxStages))
    throw ProfileError(std::to_string(stages.size()) + " stages, more than remat handles (" +
                       std::to_string(kMaxStages) + "): group layers into fewer stages");
  if (options.repeat() < 1 || options.repeat() > kMaxProfileRepeat)
    throw ProfileError("repeat (" + std::to_string(options.repeat()) + ") must be from 1 to " +
                       std::to_string(kMaxProfileRepeat));
  if (options.warmup() < 0 || options.warmup() > kMaxProfileRepeat)
    throw ProfileError("warmup (" + std::to_string(options.warmup()) + ") must be from 0 to " +
                       std::to_string(kMaxProfileRepeat));
  if (!(options.max_steps() >= 0 && options.max_steps() <= kMaxProfileRepeat))
    throw ProfileError("max_steps (" + std::to_string(options.max_steps()) +
                       ") must be from 0 to " + std::to_string(kMaxProfileRepeat));
  if (inputs.empty()) throw ProfileError("the sample has no input tensors");
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined())
      throw ProfileError("the sample input" + member_name(inputs, k) + " is an undefined tensor");
    if (inputs[k].is_inference())
      throw ProfileError("the sample input" + member_name(inputs, k) +
                         " was made in inference mode, and autograd cannot use it: make the "
                         "sample outside torch.inference_mode()");
  }
  const c10::Device device = inputs.front().device();
  for (const auto* list : {&inputs, &context}) {
    for (std::size_t k = 0; k < list->size(); ++k) {
      const torch::Tensor& t = (*list)[k];
      const std::string what = list == &inputs ? "the sample input" + member_name(inputs, k)
                                               : "context tensor " + std::to_string(k);
      if (!t.defined()) throw ProfileError(what + " is an undefined tensor");
      if (const auto kind = unsupported_kind(t))
        throw ProfileError(what + " is " + *kind +
                           ": remat's stages take dense (strided) tensors only (give a dense "
                           "one, and make it sparse or nested inside the first stage)");
      if (t.device() != device)
        throw ProfileError(what + " is on " + t.device().str() + " but the sample input is on " +
                           device.str() + ": every tensor of a step must be on one device");
      if (list == &context && t.requires_grad())
        throw ProfileError(what +
                           " requires grad; context tensors have no gradient (pass it detached, "
                           "or make it an input member)");
    }
  }
  bool context_taken = false;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    if (!stages[i].module)
      throw ProfileError(describe(static_cast<int>(i), stages[i].name) + " has no module (null)");
    check_device(stages[i], static_cast<int>(i), device);
    context_taken = context_taken || stages[i].module->takes_context();
  }
  if (!context.empty() && !context_taken)
    throw ProfileError(std::to_string(context.size()) +
                       " context tensor(s) given, but no stage takes the context: they would be "
                       "counted and never used (make the stages that need them with "
                       "takes_context = true)");
  return device;
}

// "3 stages, input [2, 3, 32, 32] Float cpu": the chain's name when the options give none.
std::string default_chain_name(int length, const Tensors& inputs, c10::Device device) {
  std::ostringstream name;
  name << counted(static_cast<std::int64_t>(length), "stage") << ", input ";
  for (std::size_t k = 0; k < inputs.size(); ++k)
    name << (k ? " + " : "") << inputs[k].sizes() << " " << inputs[k].scalar_type();
  name << " " << device;
  return name.str();
}

// The memory of stage i, measured in four phases, one method each, called in this order:
// the forward without autograd (x_{i+1} for the next stage), the forward with autograd (the
// output members, what the graph keeps, the temporary), the state the graph keeps, and the
// backward. Its members hold what one phase hands to the next.
class StageMeasurement {
 public:
  StageMeasurement(const NamedStage& named, int i, const Tensors& context, const Chain& chain,
                   c10::Device device, MemoryTracker& tracker, bool warm_up)
      : named_(named),
        i_(i),
        run_{named, i, context},
        chain_(chain),
        in_members_(chain.members(i)),
        device_(device),
        tracker_(tracker),
        warm_up_(warm_up) {
    for (const Member& m : in_members_) wants_grad_ = wants_grad_ || m.grad;
    stage_.name = named.name;
  }

  const Runner& runner() const { return run_; }
  const std::vector<Member>& in_members() const { return in_members_; }
  // The layouts of the gradients of the stage's output members its backward is measured from
  // (before forward_without_autograd, which warms the stage up with them); none: plain ones.
  void seed_with(Layouts seeds) { seeds_ = std::move(seeds); }
  // The layouts of its input members' gradients as its backward left them, once measured.
  const Layouts& produced() const { return produced_; }

  // Forward without autograd first: x_{i+1} for the next stage, and a check that the stage
  // leaves its input alone (with autograd, an in-place change of the input is refused).
  // A tensor the stage before returned as several members (`return h, h`) is handed as
  // distinct tensors on its storage, as with autograd below: which of them an output
  // passes on is then the member it names, the same in both forwards.
  Tensors forward_without_autograd(Tensors& x) {
    synchronize(device_);
    Tensors next;
    {
      torch::NoGradGuard no_grad;
      for (std::size_t k = 0; k < x.size(); ++k)
        for (std::size_t j = 0; j < k; ++j)
          if (x[k].is_same(x[j])) {
            x[k] = x[k].detach();
            break;
          }
      if (warm_up_) {
        (void)run_(x);
        synchronize(device_);
      }
      PeakScope scope(tracker_);
      next = run_(x);
      synchronize(device_);
      stage_.fwd_nograd_tmp_bytes =
          std::max<std::int64_t>(0, scope.peak_above_start() - scope.live_above_start());
    }
    carried_ = carried_members(named_, i_, x, next);
    if (warm_up_) warm_up_stage(run_, named_, i_, x, in_members_, device_, seeds_);
    return next;
  }

  // Forward with autograd, on copies of the input members (their own storages, made before
  // the measurement) handed over as the runtime hands them (stage_input.h). Then our handles
  // on the inputs and the outputs go: what stays alive is what the stage's graph keeps.
  void forward_with_autograd(const Tensors& x, std::size_t n_out, const ModelState& state) {
    const std::size_t n_in = x.size();
    Tensors handed;
    for (std::size_t k = 0; k < n_in; ++k) {
      detail::StageInput input = detail::stage_input(copy_laid_out(x[k]), in_members_[k].grad);
      in_bytes_.push_back(storage_bytes({input.tensor}));
      in_storage_.push_back(input.tensor.storage().getWeakStorageImpl());
      handed.push_back(std::move(input.tensor));
      sinks_.push_back(std::move(input.sink));
    }
    edges_.assign(n_out, torch::autograd::Edge());
    out_storage_.assign(n_out, std::nullopt);
    out_options_.assign(n_out, torch::TensorOptions());
    out_shapes_.assign(n_out, {});
    PeakScope scope(tracker_);
    Tensors out = run_(handed);
    synchronize(device_);
    stage_.fwd_tmp_bytes =
        std::max<std::int64_t>(0, scope.peak_above_start() - scope.live_above_start());
    if (out.size() != n_out || carried_members(named_, i_, handed, out) != carried_)
      throw ProfileError(describe(i_, named_.name) +
                         " returns a different list of tensors with autograd than without");
    bool any_grad = false;
    for (std::size_t o = 0; o < n_out; ++o) {
      out_shapes_[o] = out[o].sizes().vec();
      out_options_[o] = out[o].options();
      if (carried_[o] >= 0) {
        const Member& source = in_members_[static_cast<std::size_t>(carried_[o])];
        Member member = source;
        member.carried_from = carried_[o];
        stage_.outputs.push_back(member);
        any_grad = any_grad || source.grad;
        continue;
      }
      // A view of an input member, or a storage shared by several outputs, counts its whole
      // storage as new bytes: an overstatement while the input or the other outputs are live,
      // and what it keeps alive once they are gone. (Its own elements, where it is a slice,
      // were below that: a slice carried on past its base held the whole storage, above the
      // prediction and the budget.) The stage ran on copies of its input members, each in a
      // storage of its own; in the chain an input member may be a view of a larger storage
      // (q of a projection that makes q, k and v at once), which the view keeps alive: it
      // counts what that input member counts, where that is more.
      bool view_of_input = false;
      std::int64_t kept_alive = 0;
      for (std::size_t k = 0; k < handed.size(); ++k) {
        if (!shares_storage(out[o], handed[k])) continue;
        view_of_input = true;
        kept_alive = std::max(kept_alive, in_members_[k].bytes);
      }
      stage_.outputs.push_back(new_member(out[o], out[o].requires_grad(), kept_alive));
      any_grad = any_grad || out[o].requires_grad();
      if (!view_of_input) out_storage_[o] = out[o].storage().getWeakStorageImpl();
      if (out[o].requires_grad()) edges_[o] = torch::autograd::impl::gradient_edge(out[o]);
    }
    if (!any_grad && (wants_grad_ || has_trainable_parameters(named_)))
      throw ProfileError(describe(i_, named_.name) +
                         " returned no tensor that requires grad: its backward cannot reach its "
                         "input or parameters (is its output detached?)");
    check_declared_leaves(edges_, state, i_, named_);
    out.clear();
    handed.clear();
    kept_ = scope.live_above_start();
  }

  // kept = (kept outputs) + state - (the inputs the graph let go).
  void account_state() {
    std::int64_t state_bytes = kept_;
    for (std::size_t k = 0; k < in_storage_.size(); ++k) {
      if (in_storage_[k].use_count() > 0)
        stage_.saved_inputs.push_back(static_cast<int>(k));
      else
        state_bytes += in_bytes_[k];
    }
    for (std::size_t o = 0; o < out_storage_.size(); ++o) {
      if (out_storage_[o] && out_storage_[o]->use_count() > 0) {
        stage_.saved_outputs.push_back(static_cast<int>(o));
        state_bytes -= stage_.outputs[o].bytes;
      }
    }
    stage_.state_bytes = std::max<std::int64_t>(0, state_bytes);
  }

  // Backward, from the graph edges of the new output members, with gradients of ones that
  // the engine alone holds (freed once used, as inside a chain), and from the sinks of the
  // carried members: the engine adds what each also gets from inside the stage to its passed
  // gradient as it arrives (in place where it can), which counts as temporary.
  // The output members the loss does not differentiate (`differentiated[o]` false; empty: it
  // differentiates every one, or this is not the last stage) get no gradient, as from a loss
  // that does not read them, and are marked so (Member::loss_gradient).
  void backward(const std::vector<bool>& differentiated = {}) {
    for (std::size_t o = 0; o < differentiated.size(); ++o)
      stage_.outputs[o].loss_gradient = differentiated[o];
    const auto passed = [&](std::size_t o) { return stage_.outputs[o].loss_gradient; };
    std::vector<torch::autograd::Edge> roots;
    Tensors root_grads;
    for (std::size_t o = 0; o < edges_.size(); ++o) {
      if (!passed(o)) continue;
      // A carried member's passed gradient enters first at the sink of the input it carries,
      // as the runtime's backward has it (executor.cpp), live before the backward as in the
      // chain.
      if (carried_[o] >= 0) {
        const auto k = static_cast<std::size_t>(carried_[o]);
        if (stage_.outputs[o].grad && sinks_[k]) {
          roots.emplace_back(sinks_[k], 0);
          root_grads.push_back(ones_gradient(out_shapes_[o], out_options_[o], seed(o)));
        }
        continue;
      }
      if (!edges_[o].is_valid()) continue;
      roots.push_back(std::move(edges_[o]));
      root_grads.push_back(ones_gradient(out_shapes_[o], out_options_[o], seed(o)));
    }
    const auto saved_held = held_through_backward();
    if (!roots.empty()) {
      synchronize(device_);
      PeakScope scope(tracker_);
      stage_backward(named_, i_, std::move(roots), std::move(root_grads));
      // As the runtime does, member by member, each in its own storage: a carried member's
      // (the passed one with what the stage added) then goes; another member's is kept.
      std::int64_t input_grad_bytes = 0;
      produced_.assign(sinks_.size(), std::nullopt);
      for (std::size_t k = 0; k < sinks_.size(); ++k) {
        if (!sinks_[k]) continue;
        torch::Tensor& gradient = sinks_[k]->gradient;
        gradient = detail::compact_gradient(std::move(gradient));  // as the runtime keeps it
        produced_[k] = layout_of(gradient);
        bool passed_on = false;  // a carried member whose gradient came in from y_{i+1}
        for (std::size_t o = 0; o < carried_.size(); ++o)
          passed_on = passed_on || (carried_[o] == static_cast<int>(k) && passed(o));
        if (passed_on)
          gradient = torch::Tensor();
        else
          input_grad_bytes += storage_bytes({gradient});
      }
      synchronize(device_);
      stage_.bwd_tmp_bytes =
          std::max<std::int64_t>(0, scope.peak_above_start() - input_grad_bytes);
    }
    sinks_.clear();
  }

  Stage& stage() { return stage_; }
  const std::vector<std::vector<std::int64_t>>& output_shapes() const { return out_shapes_; }

 private:
  // A saved input member that is a storage of x_0 (x_0's own, or carried on from it), one that
  // is carried into or out of this stage, or one that the stage before keeps as its output,
  // stays allocated through the measurement: the stage's graph may let it go before the
  // backward's peak (a mask, or an activation, that the stage's last operation reads), while
  // in the chain another holder keeps it: the caller's x_0, another stage that keeps the
  // carried storage for its own backward, or the stage before, taped. A peak measured without
  // it would be that much too low. Where nothing else holds it, the prediction is that much
  // above the measured peak, never below (docs/cost-model.md).
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> held_through_backward() const {
    std::vector<c10::intrusive_ptr<c10::StorageImpl>> saved_held;
    for (const int k : stage_.saved_inputs) {
      const bool carried_in = in_members_[static_cast<std::size_t>(k)].carried();
      const bool carried_on = std::find(carried_.begin(), carried_.end(), k) != carried_.end();
      bool kept_before = false;
      if (i_ > 0) {
        const std::vector<int>& before =
            chain_.stages[static_cast<std::size_t>(i_) - 1].saved_outputs;
        kept_before = std::find(before.begin(), before.end(), k) != before.end();
      }
      if (carried_in || carried_on || kept_before || is_input_storage(chain_, i_, k))
        if (auto held = in_storage_[static_cast<std::size_t>(k)].lock()) saved_held.push_back(held);
    }
    return saved_held;
  }

  std::optional<GradientLayout> seed(std::size_t o) const {
    return o < seeds_.size() ? seeds_[o] : std::nullopt;
  }

  const NamedStage& named_;
  const int i_;
  const Runner run_;
  const Chain& chain_;  // the stages before this one, measured
  const std::vector<Member> in_members_;
  const c10::Device device_;
  MemoryTracker& tracker_;
  const bool warm_up_;
  bool wants_grad_ = false;
  Stage stage_;
  std::vector<int> carried_;  // carried_members(): the input member each output passes on
  // The forward with autograd's input members: each storage's bytes, a weak handle on it
  // (alive after the forward: the graph saved it), and the sink of its gradient.
  std::vector<std::int64_t> in_bytes_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> in_storage_;
  std::vector<detail::NodePtr<detail::GradientSink>> sinks_;
  // Its outputs: the graph edge of each new member, a weak handle on its storage (none for a
  // view of an input), its options and shape (for the gradient of ones), what the graph kept.
  std::vector<torch::autograd::Edge> edges_;
  std::vector<std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>>> out_storage_;
  std::vector<torch::TensorOptions> out_options_;
  std::vector<std::vector<std::int64_t>> out_shapes_;
  std::int64_t kept_ = 0;
  Layouts seeds_, produced_;
};

// The loss called on the chain's output, its failures reported as the loss's.
template <class F>
auto in_loss(const std::vector<NamedStage>& stages, F&& f) {
  try {
    return f();
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const ProfileError&) {
    throw;
  } catch (const std::exception& error) {
    // The loss is the caller's code, in the language of the stages.
    if (stages.back().module->interrupts(std::current_exception())) throw;
    std::throw_with_nested(ProfileError(
        std::string("the loss function failed on the chain's output: ") + message_of(error)));
  }
}

torch::Tensor checked_loss(const ProfileOptions& options, const Tensors& values) {
  torch::Tensor value = options.loss()(values);
  if (!value.defined() || value.numel() != 1)
    throw ProfileError("the loss function returned " +
                       (value.defined() ? "a tensor of shape " + c10::str(value.sizes())
                                        : std::string("an undefined tensor")) +
                       ", not one value");
  return value;
}

// Which members of the chain's output x_L (`outputs`, made without autograd; `members`, their
// gradients) the loss differentiates: its gradient reaches them. A model that returns its
// logits beside its own loss, the loss being that member, leaves the logits without one.
// Empty where it reaches every member with a gradient, or where only one has a gradient (the
// loss must reach it): then the loss is not called here, and its first call is measure_loss's.
std::vector<bool> loss_differentiates(const std::vector<NamedStage>& stages,
                                      const std::vector<Member>& members, const Tensors& outputs,
                                      const ProfileOptions& options) {
  if (std::count_if(members.begin(), members.end(), [](const Member& m) { return m.grad; }) < 2)
    return {};
  Tensors values, wrt;
  std::vector<std::size_t> which;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    torch::Tensor value = outputs[k].detach();
    if (members[k].grad) {
      value.requires_grad_(true);
      wrt.push_back(value);
      which.push_back(k);
    }
    values.push_back(std::move(value));
  }
  const Tensors gradients = in_loss(stages, [&] {
    const torch::Tensor value = checked_loss(options, values);
    if (!value.requires_grad())
      throw ProfileError(
          "the loss function's value does not depend on any member of the chain's output that "
          "has a gradient: there is nothing to train");
    return torch::autograd::grad({value}, wrt, {}, /*retain_graph=*/false,
                                 /*create_graph=*/false, /*allow_unused=*/true);
  });
  std::vector<bool> out(outputs.size(), true);
  bool all = true;
  for (std::size_t j = 0; j < which.size(); ++j)
    if (!gradients[j].defined()) out[which[j]] = false, all = false;
  return all ? std::vector<bool>{} : out;
}

// The loss's temporary memory: its forward and backward on x_L (`outputs`), handed over as
// the runtime's forward returns it (not a leaf, so that the loss's graph keeps it only if the
// loss saved it: a leaf would be held by its gradient accumulator), less what the loss's
// backward passed to x_L. Run once unmeasured first where the stages were warmed up.
std::int64_t measure_loss(const std::vector<NamedStage>& stages, const Chain& chain,
                          Tensors outputs, const ProfileOptions& options, c10::Device device,
                          MemoryTracker& tracker, bool warm_up, Layouts& layouts) {
  const std::vector<Member>& members = chain.members(chain.length());
  const auto run_loss = [&](Tensors values, bool measure) {
    std::vector<detail::NodePtr<detail::GradientSink>> sinks;
    for (std::size_t k = 0; k < values.size(); ++k) {
      detail::StageInput output = detail::stage_input(values[k], members[k].grad);
      values[k] = std::move(output.tensor);
      sinks.push_back(std::move(output.sink));
    }
    synchronize(device);
    std::optional<PeakScope> measured;
    if (measure) measured.emplace(tracker);
    in_loss(stages, [&] {
      torch::Tensor value = checked_loss(options, values);
      // A step written `loss(model(x)).backward()` lets the output go once the loss has its
      // value; one that keeps `out = model(x)` holds it through the backward.
      if (!options.output_held()) values.clear();
      torch::autograd::backward({value});
    });
    synchronize(device);
    std::int64_t gradient_bytes = 0;  // y_L: the members the loss differentiates
    layouts.assign(sinks.size(), std::nullopt);
    for (std::size_t k = 0; k < sinks.size(); ++k) {
      if (!sinks[k] || !sinks[k]->gradient.defined()) continue;
      gradient_bytes += storage_bytes({sinks[k]->gradient});
      layouts[k] = layout_of(sinks[k]->gradient);  // as the runtime's B_{L-1} gets it
    }
    return measured ? std::max<std::int64_t>(0, measured->peak_above_start() - gradient_bytes)
                    : std::int64_t{0};
  };
  if (warm_up) {
    Tensors copies;
    for (const torch::Tensor& t : outputs) copies.push_back(t.clone());
    (void)run_loss(std::move(copies), false);
  }
  return run_loss(std::move(outputs), true);
}

// Timing::kPasses, once every stage's memory is measured: the times within whole passes.
// Automatic on a GPU only where the passes' store-all memory fits with room to spare beside
// what is allocated; else, or out of memory, each stage alone. Returns the timing used.
Timing time_after_measuring(const std::vector<NamedStage>& stages, const Tensors& inputs,
                            const Tensors& context, const ProfileOptions& options,
                            const ProfileOptions& stage_timing, c10::Device device,
                            Clock::time_point started, Chain& chain) {
  bool fits = true;
  if (options.timing() == Timing::kAuto && device.is_cuda())
    fits = static_cast<double>(store_all_peak(chain)) <=
           0.8 * static_cast<double>(
                     detail::cuda_free_bytes(device.has_index() ? device.index() : -1));
  else if (options.timing() == Timing::kAuto)  // bounded, on the CPU
    fits = static_cast<double>(store_all_peak(chain)) <=
           0.5 * static_cast<double>(available_memory_bytes());
  if (fits && time_in_passes(stages, inputs, context, options, device, started, chain))
    return Timing::kPasses;
  Tensors y;
  for (const torch::Tensor& input : inputs) y.push_back(input.detach());
  for (int i = 0; i < chain.length(); ++i) {
    const Runner run{stages[static_cast<std::size_t>(i)], i, context};
    Tensors next;
    {
      torch::NoGradGuard no_grad;
      next = run(y);
    }
    time_stage(run, y, next, chain.members(i), stage_timing, device,
               chain.stages[static_cast<std::size_t>(i)]);
    y = std::move(next);
  }
  return Timing::kStages;
}

// Whether the layouts `used` and `wanted` of a stage's output gradients are the same, none
// standing for the plain layout.
bool same_layouts(const Layouts& used, const Layouts& wanted) {
  for (std::size_t o = 0; o < std::max(used.size(), wanted.size()); ++o) {
    const auto a = o < used.size() ? used[o] : std::nullopt;
    const auto b = o < wanted.size() ? wanted[o] : std::nullopt;
    if (!(a == b)) return false;
  }
  return true;
}

// The backward of each stage measured again where the gradients a step hands it are laid out
// otherwise than those it was measured from: in a step, stage i's backward gets y_{i+1} as
// stage i+1's backward left it (or the loss, for the last stage), and a permuted gradient may
// cost a backward a copy (twins_svt_small's and tiny_vit's, whose stages work channels-last,
// went up to 1.5 MiB above their prediction). From the last stage down, as in a step, so that
// a layout passed on through several stages is followed to its end; each stage's input x_i is
// made again by forwards without autograd, from inputs kept at every `span`-th stage (about
// the square root of the length: at most about twice that many inputs live, and at most one
// more forward per stage). Nothing is done, and nothing kept, where every layout is plain.
void remeasure_backwards(const std::vector<NamedStage>& stages, const Tensors& inputs,
                         const Tensors& context, c10::Device device, MemoryTracker& tracker,
                         bool warm_up, const ModelState& state,
                         const std::vector<std::vector<bool>>& differentiated,
                         const Layouts& loss_layouts, std::vector<Layouts>& produced,
                         Chain& chain) {
  const int length = chain.length();
  // The layouts each stage's backward was measured from: plain at first.
  std::vector<Layouts> seeds(static_cast<std::size_t>(length));
  const auto wanted = [&](int i) -> const Layouts& {
    return i + 1 < length ? produced[static_cast<std::size_t>(i) + 1] : loss_layouts;
  };
  bool any = false;
  for (int i = 0; i < length && !any; ++i)
    any = !same_layouts(seeds[static_cast<std::size_t>(i)], wanted(i));
  if (!any) return;
  const int span = std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(length)))));
  const auto forward = [&](int i, const Tensors& x) {
    torch::NoGradGuard no_grad;
    Tensors detached;
    for (const torch::Tensor& t : x) detached.push_back(t.detach());
    return Runner{stages[static_cast<std::size_t>(i)], i, context}(detached);
  };
  std::vector<Tensors> kept;  // x_0, x_span, x_2span, ...
  {
    Tensors x;
    for (const torch::Tensor& input : inputs) x.push_back(input.detach().clone());
    for (int i = 0; i < length; ++i) {
      if (i % span == 0) kept.push_back(x);
      if (i + 1 < length) x = forward(i, x);
    }
  }
  std::vector<Tensors> part;  // x_first .. of the span being worked on
  int first = -1;
  for (int i = length - 1; i >= 0; --i) {
    const auto ui = static_cast<std::size_t>(i);
    if (same_layouts(seeds[ui], wanted(i))) continue;
    const int start = i / span * span;
    if (start != first) {
      part.clear();
      part.push_back(kept[static_cast<std::size_t>(start / span)]);
      for (int k = start; k < i; ++k) part.push_back(forward(k, part.back()));
      first = start;
    }
    Tensors x = part[static_cast<std::size_t>(i - start)];
    StageMeasurement measure(stages[ui], i, context, chain, device, tracker, warm_up);
    measure.seed_with(wanted(i));
    const Tensors next = measure.forward_without_autograd(x);
    measure.forward_with_autograd(x, next.size(), state);
    measure.account_state();
    measure.backward(differentiated[ui]);
    chain.stages[ui].bwd_tmp_bytes = measure.stage().bwd_tmp_bytes;
    produced[ui] = measure.produced();
    seeds[ui] = wanted(i);
    part.resize(static_cast<std::size_t>(i - start));  // x_i is not needed again
  }
}

// A gradient the runtime keeps is a copy of its member's own elements, or, where a stage's
// backward gives it as a slice with gaps (a concatenation's), that copy with narrower gaps
// (compact_gradient): a few bytes more, which `produced` (the layouts each stage's backward left
// its input members' gradients in) shows. A member's grad_bytes becomes the largest its gradient
// is kept at, the same for every member that is one storage carried on.
void count_kept_gradients(const std::vector<Layouts>& produced, c10::Device device, Chain& chain) {
  const int length = chain.length();
  const Chain::Storages storages = chain.storages();
  const std::vector<std::vector<int>>& storage = storages.ids;
  std::vector<std::int64_t> kept;  // per storage: the most its gradient is kept at
  for (const Member& maker : storages.makers) kept.push_back(maker.gradient_size());
  bool any = false;
  for (int i = 0; i < length; ++i) {
    const auto ui = static_cast<std::size_t>(i);
    const std::vector<Member>& members = chain.members(i);
    for (std::size_t k = 0; k < produced[ui].size() && k < members.size(); ++k) {
      const std::optional<GradientLayout>& layout = produced[ui][k];
      if (!layout || !members[k].grad) continue;
      const std::int64_t bytes = counted_bytes(device, layout->storage_bytes);
      std::int64_t& most = kept[static_cast<std::size_t>(storage[ui][k])];
      if (bytes > most) {
        most = bytes;
        any = true;
      }
    }
  }
  if (!any) return;
  const auto set = [&](Member& member, int id) {
    const std::int64_t most = kept[static_cast<std::size_t>(id)];
    if (!member.grad || most == member.gradient_size()) return;
    member.grad_bytes = most;
    if (*member.grad_bytes == member.bytes) member.grad_bytes.reset();
  };
  for (std::size_t k = 0; k < chain.inputs.size(); ++k) set(chain.inputs[k], storage[0][k]);
  for (int i = 0; i < length; ++i) {
    const auto ui = static_cast<std::size_t>(i);
    std::vector<Member>& outputs = chain.stages[ui].outputs;
    for (std::size_t k = 0; k < outputs.size(); ++k) set(outputs[k], storage[ui + 1][k]);
  }
}

}  // namespace

Profile profile(const std::vector<NamedStage>& stages, const Tensors& inputs,
                const Tensors& context, const ProfileOptions& options) {
  const auto started = Clock::now();
  const detail::ProfilingScope profiling;
  const c10::Device device = check_profile_arguments(stages, inputs, context, options);
  // The chain is the training step's, whatever the caller's mode: measuring under
  // torch.no_grad() or inference mode (a first step in a validation loop) runs forwards with
  // autograd and backwards all the same.
  c10::InferenceMode not_inference(false);
  torch::AutoGradMode with_autograd(true);
  MemoryTracker& tracker = MemoryTracker::for_device(device);
  const int length = static_cast<int>(stages.size());
  // Work and allocations without an explicit device go to the sample's GPU.
  c10::OptionalDeviceGuard device_guard;
  if (device.is_cuda()) {
    device_guard.reset_device(device);
    exact_cuda_blocks();  // each tensor's block is its counted bytes (memory_tracker.h)
    start_device_libraries(device);
  }

  ModelState state(stages, device);
  for (const NamedStage& stage : stages) stage.module->train(true);
  state.allocate_grads();

  Profile result;
  result.chain.name = options.name();
  if (result.chain.name.empty()) result.chain.name = default_chain_name(length, inputs, device);
  // A member of the chain's input has a gradient if the sample's wants one (plain autograd
  // computes none for a batch of images, and neither does the runtime).
  Tensors x;
  for (const torch::Tensor& input : inputs) {
    x.push_back(input.detach().clone());
    result.chain.inputs.push_back(new_member(x.back(), input.requires_grad()));
  }
  result.chain.context_bytes = storage_bytes(context);
  // How the times are taken: kPasses after every stage is measured; kStages in the loop.
  const bool bounded = options.max_steps() > 0;
  const Timing timing = !options.measure_time() ? Timing::kStages
                        : options.timing() != Timing::kAuto ? options.timing()
                        : device.is_cuda() || bounded       ? Timing::kPasses
                                                            : Timing::kStages;
  const bool per_stage_times = options.measure_time() && timing == Timing::kStages;
  // Bounded, a stage timed alone runs each quantity once more, after the memory's runs.
  ProfileOptions stage_timing = options;
  if (bounded) stage_timing.repeat(1).warmup(0).min_repetition_ms(0);

  // A stage's first call may do once what later calls do not, and allocate for it: on a GPU,
  // torch.compile autotunes its Triton kernels with a buffer of the L2 cache's size (60 MiB on
  // an H200, where a compiled stage was predicted at that much above its measured peak), and
  // cuDNN searches its algorithms under cudnn.benchmark. So each stage runs once, unmeasured,
  // before its memory is measured: forward without autograd, with autograd, and backward (and
  // the loss likewise).
  const bool warm_up = device.is_cuda() || options.warm_up_on_cpu();
  // Each stage's backward is measured first from plain gradients of ones, and the layouts of
  // its input members' gradients as it left them are kept (`produced`), then again where the
  // next stage's, or the loss's, differ (remeasure_backwards).
  std::vector<Layouts> produced;
  std::vector<std::vector<bool>> differentiated;
  for (int i = 0; i < length; ++i) {
    const NamedStage& named = stages[static_cast<std::size_t>(i)];
    if (options.progress()) options.progress()(i, length, named.name);
    StageMeasurement measure(named, i, context, result.chain, device, tracker, warm_up);
    Tensors next = measure.forward_without_autograd(x);
    measure.forward_with_autograd(x, next.size(), state);
    measure.account_state();
    result.output_shapes.push_back(measure.output_shapes());
    // The last stage's backward from the gradients the loss gives: none for a member it does
    // not read.
    differentiated.emplace_back();
    if (i == length - 1 && options.loss())
      differentiated.back() = loss_differentiates(stages, measure.stage().outputs, next, options);
    measure.backward(differentiated.back());
    produced.push_back(measure.produced());
    if (per_stage_times)
      time_stage(measure.runner(), x, next, measure.in_members(), stage_timing, device,
                 measure.stage());
    result.chain.stages.push_back(measure.stage());
    x = std::move(next);
  }
  Layouts loss_layouts;
  if (options.loss()) {
    Tensors outputs = std::move(x);
    x.clear();
    result.chain.loss_tmp_bytes = measure_loss(stages, result.chain, std::move(outputs), options,
                                               device, tracker, warm_up, loss_layouts);
  }
  x.clear();
  remeasure_backwards(stages, inputs, context, device, tracker, warm_up, state, differentiated,
                      loss_layouts, produced, result.chain);
  count_kept_gradients(produced, device, result.chain);
  if (timing == Timing::kPasses)
    result.timing = time_after_measuring(stages, inputs, context, options, stage_timing, device,
                                         started, result.chain);
  result.chain.output_held = options.output_held();
  if (options.measure_link()) result.chain.link = measure_link(device, std::int64_t{64} << 20, options.repeat());
  if (options.progress()) options.progress()(length, length, "");
  result.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  result.chain.validate("profile");
  return result;
}

}  // namespace remat
