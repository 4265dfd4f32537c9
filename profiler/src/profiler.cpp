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
//                    gradient the engine alone holds - (live before it + x's gradient).
// and, with a loss function, for the chain's output x_L (a leaf that requires grad):
//   loss_tmp_bytes = peak during the loss's forward and backward - (live before it + the
//                    bytes of x_L's gradient y_L).
#include "remat/profiler/profiler.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "remat/profiler/generator_state.h"
#include "remat/profiler/stage_input.h"

namespace remat {
namespace {

using Clock = std::chrono::steady_clock;

std::string describe(int index, const std::string& name) {
  return "stage " + std::to_string(index) + " (" + name + ")";
}

// Everything profiling may change, restored by the destructor.
class ModelState {
 public:
  ModelState(const std::vector<NamedStage>& stages, c10::Device device) : device_(device) {
    std::unordered_set<const torch::nn::Module*> seen;
    for (const NamedStage& stage : stages) {
      for (const auto& module : stage.module.ptr()->modules(/*include_self=*/true)) {
        if (!seen.insert(module.get()).second) continue;
        modules_.push_back({module, module->is_training()});
      }
    }
    torch::NoGradGuard no_grad;
    for (const auto& entry : modules_) {
      for (auto& p : entry.module->parameters(/*recurse=*/false)) {
        const torch::Tensor& grad = p.grad();
        grads_.push_back({p, grad.defined() ? std::optional<torch::Tensor>(grad.clone()) : std::nullopt});
      }
      for (auto& b : entry.module->buffers(/*recurse=*/false)) buffers_.push_back({b, b.clone()});
    }
    cpu_rng_ = generator_state(c10::Device(c10::kCPU));
    if (device.is_cuda()) cuda_rng_ = generator_state(device);
  }
  ModelState(const ModelState&) = delete;
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
    try {
      torch::NoGradGuard no_grad;
      for (auto& entry : grads_) {
        if (entry.grad)
          entry.param.mutable_grad() = *entry.grad;
        else
          entry.param.mutable_grad() = torch::Tensor();
      }
      for (auto& entry : buffers_) entry.buffer.copy_(entry.saved);
      // train() recurses into children; modules_ is in pre-order (parents first), so each
      // module ends with its own recorded flag.
      for (auto& entry : modules_) entry.module->train(entry.training);
      set_generator_state(c10::Device(c10::kCPU), cpu_rng_);
      if (device_.is_cuda()) set_generator_state(device_, cuda_rng_);
    } catch (...) {
      // A destructor must not throw; restoring plain tensors does not fail in practice.
    }
  }

 private:
  struct ModuleEntry {
    std::shared_ptr<torch::nn::Module> module;
    bool training;
  };
  struct GradEntry {
    torch::Tensor param;
    std::optional<torch::Tensor> grad;
  };
  struct BufferEntry {
    torch::Tensor buffer, saved;
  };
  c10::Device device_;
  std::vector<ModuleEntry> modules_;
  std::vector<GradEntry> grads_;
  std::vector<BufferEntry> buffers_;
  torch::Tensor cpu_rng_, cuda_rng_;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Median over repetitions of the time of `timed`, each preceded by an untimed `setup`; a
// repetition runs both `inner` times, `inner` chosen so that it lasts min_repetition_ms.
template <class Setup, class Timed>
double time_ms(const ProfileOptions& options, c10::Device device, const Setup& setup,
               const Timed& timed) {
  auto run = [&](int count) {
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
  double warm = 0;
  for (int k = 0; k < std::max(1, options.warmup()); ++k) warm = run(1);
  const int inner = static_cast<int>(
      std::clamp(std::ceil(options.min_repetition_ms() / std::max(warm, 1e-3)), 1.0, 1000.0));
  std::vector<double> samples;
  for (int r = 0; r < std::max(1, options.repeat()); ++r) samples.push_back(run(inner) / inner);
  return median(samples);
}

struct Runner {
  const NamedStage& stage;
  int index;

  torch::Tensor operator()(const torch::Tensor& x) const {
    const auto version = x._version();
    std::optional<torch::nn::AnyValue> value;
    try {
      // any_forward is not const, although it does not change the holder.
      value.emplace(const_cast<torch::nn::AnyModule&>(stage.module).any_forward(x));
    } catch (const c10::OutOfMemoryError&) {
      throw;  // not the stage's fault: the caller may retry with less
    } catch (const std::exception& error) {
      throw ProfileError(describe(index, stage.name) + ": forward failed: " + error.what());
    }
    if (x._version() != version)
      throw ProfileError(describe(index, stage.name) +
                         " modified its input in place; a stage must not (fold the in-place "
                         "operation into the stage before it, or make it out of place)");
    torch::Tensor* out = value->try_get<torch::Tensor>();
    if (out == nullptr)
      throw ProfileError(describe(index, stage.name) + " returned " +
                         c10::demangle(value->type_info().name()) +
                         ", not one tensor: every stage must map one tensor to one tensor");
    if (!out->defined())
      throw ProfileError(describe(index, stage.name) + " returned an undefined tensor");
    return *out;
  }
};

bool has_trainable_parameters(const NamedStage& stage) {
  for (const auto& p : stage.module.ptr()->parameters())
    if (p.requires_grad()) return true;
  return false;
}

bool shares_storage(const torch::Tensor& a, const torch::Tensor& b) {
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

void check_device(const NamedStage& stage, int index, c10::Device device) {
  for (const auto& p : stage.module.ptr()->parameters())
    if (p.device() != device)
      throw ProfileError(describe(index, stage.name) + " has parameters on " + p.device().str() +
                         " but the sample is on " + device.str() +
                         ": move the model or the sample so that they agree");
  for (const auto& b : stage.module.ptr()->buffers())
    if (b.device() != device)
      throw ProfileError(describe(index, stage.name) + " has buffers on " + b.device().str() +
                         " but the sample is on " + device.str());
}

}  // namespace

namespace {
at::Generator default_generator(c10::Device device) {
  // A tensor's device always has an index; a bare "cuda" means the first GPU here.
  if (device.is_cuda() && !device.has_index()) device = c10::Device(c10::kCUDA, 0);
  return at::globalContext().defaultGenerator(device);
}
}  // namespace

torch::Tensor generator_state(c10::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(c10::Device device, const torch::Tensor& state) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
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

// "torch::nn::Conv2dImpl" -> "Conv2d", "(anonymous namespace)::PairImpl" -> "Pair".
std::string short_type_name(std::string name) {
  for (const std::string prefix : {"(anonymous namespace)::", "torch::nn::", "remat::"}) {
    for (auto at = name.find(prefix); at != std::string::npos; at = name.find(prefix))
      name.erase(at, prefix.size());
  }
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
  return name;
}

std::vector<NamedStage> stages_of(const torch::nn::Sequential& sequential) {
  std::vector<NamedStage> out;
  const auto children = sequential->named_children();
  int index = 0;
  for (const auto& module : *sequential) {
    // A child's own name ("conv1") when it has one, else its index and type ("3:Conv2d").
    const std::string& key = children[static_cast<std::size_t>(index)].key();
    const bool numbered = key.find_first_not_of("0123456789") == std::string::npos;
    out.push_back({numbered ? std::to_string(index) + ":" + short_type_name(module.ptr()->name()) : key,
                   module});
    ++index;
  }
  return out;
}

Profile profile(const std::vector<NamedStage>& stages, const torch::Tensor& sample,
                const ProfileOptions& options) {
  using detail::run_backward;
  using detail::stage_input;
  using detail::StageInput;
  const auto started = Clock::now();
  if (stages.empty()) throw ProfileError("the chain has no stages: nothing to profile");
  if (!sample.defined()) throw ProfileError("the sample input is an undefined tensor");
  if (!sample.is_floating_point())
    throw ProfileError("the sample input has dtype " + std::string(c10::toString(sample.scalar_type())) +
                       "; a floating-point input is needed to compute its gradient");
  const c10::Device device = sample.device();
  for (std::size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].module.is_empty())
      throw ProfileError(describe(static_cast<int>(i), stages[i].name) + " is an empty module");
    check_device(stages[i], static_cast<int>(i), device);
  }
  MemoryTracker& tracker = MemoryTracker::for_device(device);
  const int length = static_cast<int>(stages.size());
  // Work and allocations without an explicit device go to the sample's GPU.
  c10::OptionalDeviceGuard device_guard;
  if (device.is_cuda()) device_guard.reset_device(device);

  ModelState state(stages, device);
  for (const NamedStage& stage : stages) stage.module.ptr()->train(true);
  state.allocate_grads();

  Profile result;
  result.chain.name = options.name();
  if (result.chain.name.empty()) {
    std::ostringstream name;
    name << length << " stages, input " << sample.sizes() << " " << sample.scalar_type() << " "
         << device;
    result.chain.name = name.str();
  }
  torch::Tensor x = sample.detach().clone();
  // The chain's input has a gradient if the sample wants one (plain autograd computes none for
  // a batch of images, and neither does the runtime).
  const bool input_grad = sample.requires_grad();
  result.chain.set_input(storage_bytes({x}), input_grad);

  for (int i = 0; i < length; ++i) {
    const NamedStage& named = stages[static_cast<std::size_t>(i)];
    if (options.progress()) options.progress()(i, length, named.name);
    const Runner run{named, i};
    Stage stage;
    stage.name = named.name;
    const bool wants_grad = i > 0 || input_grad;
    synchronize(device);

    // Forward without autograd first: x_{i+1} for the next stage, and a check that the stage
    // leaves its input alone (with autograd, an in-place change of the input is refused).
    torch::Tensor next;
    std::int64_t nograd_tmp = 0;
    {
      torch::NoGradGuard no_grad;
      PeakScope scope(tracker);
      next = run(x);
      synchronize(device);
      nograd_tmp = scope.peak_above_start() - scope.live_above_start();
    }

    // Forward with autograd, on a copy of the input (its own storage, made before the
    // measurement) handed over as the runtime hands it (stage_input.h). Then our handles on
    // the input and the output go: what stays alive is what the stage's graph keeps.
    StageInput input = stage_input(x.clone(), wants_grad);
    const std::int64_t in_bytes = storage_bytes({input.tensor});
    const c10::weak_intrusive_ptr<c10::StorageImpl> in_storage =
        input.tensor.storage().getWeakStorageImpl();
    torch::autograd::Edge edge;
    std::int64_t out_bytes = 0, kept = 0, fwd_tmp = 0;
    bool out_grad = false, view_of_input = false;
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> out_storage;
    torch::TensorOptions out_options;
    std::vector<std::int64_t> out_shape;
    {
      PeakScope scope(tracker);
      torch::Tensor out = run(input.tensor);
      synchronize(device);
      fwd_tmp = scope.peak_above_start() - scope.live_above_start();
      out_grad = out.requires_grad();
      if (!out_grad && (wants_grad || has_trainable_parameters(named)))
        throw ProfileError(describe(i, named.name) +
                           " returned a tensor that does not require grad: its backward cannot "
                           "reach its input or parameters (is it detached?)");
      view_of_input = shares_storage(out, input.tensor);
      out_bytes = view_of_input ? tracker.counted_bytes(out.numel() * out.element_size())
                                : storage_bytes({out});
      out_storage = out.storage().getWeakStorageImpl();
      out_options = out.options();
      out_shape = out.sizes().vec();
      if (out_grad) edge = torch::autograd::impl::gradient_edge(out);
      out = torch::Tensor();
      input.tensor = torch::Tensor();
      kept = scope.live_above_start();
    }
    // A view of the input is the input's storage: it counts as the input, kept or not, and
    // its output member as new bytes (an overstatement while both are live).
    const bool keeps_input = in_storage.use_count() > 0;
    const bool keeps_output = !view_of_input && out_storage->use_count() > 0;
    stage.outputs = {Member{out_bytes, out_grad}};
    if (keeps_input) stage.saved_inputs = {0};
    if (keeps_output) stage.saved_outputs = {0};
    // kept = (kept output) + state - (the input, if the graph let it go).
    stage.state_bytes = std::max<std::int64_t>(
        0, kept - (keeps_output ? out_bytes : 0) + (keeps_input ? 0 : in_bytes));
    stage.fwd_tmp_bytes = std::max<std::int64_t>(0, fwd_tmp);
    stage.fwd_nograd_tmp_bytes = std::max<std::int64_t>(0, nograd_tmp);
    result.output_shapes.push_back(out_shape);

    // Backward, from the output's graph edge, with a gradient y_{i+1} of ones that the engine
    // alone holds (freed once used, as inside a chain).
    if (edge.is_valid()) {
      torch::Tensor grad = torch::ones(out_shape, out_options.requires_grad(false));
      synchronize(device);
      PeakScope scope(tracker);
      try {
        run_backward(std::move(edge), std::move(grad));
      } catch (const c10::OutOfMemoryError&) {
        throw;
      } catch (const std::exception& error) {
        throw ProfileError(describe(i, named.name) + ": backward failed: " + error.what());
      }
      synchronize(device);
      const std::int64_t input_grad_bytes = input.sink ? storage_bytes({input.sink->gradient}) : 0;
      stage.bwd_tmp_bytes = std::max<std::int64_t>(0, scope.peak_above_start() - input_grad_bytes);
    }
    input.sink.reset();
    if (options.measure_time()) {
      const torch::Tensor timing = x.detach().requires_grad_(wants_grad);
      torch::Tensor kept_out;
      stage.fwd_ms = time_ms(
          options, device, [] {}, [&] { kept_out = run(timing); });
      kept_out = torch::Tensor();
      {
        torch::NoGradGuard no_grad;
        stage.fwd_nograd_ms = time_ms(
            options, device, [] {}, [&] { kept_out = run(timing); });
        kept_out = torch::Tensor();
      }
      if (out_grad) {
        torch::Tensor grad_out = torch::ones_like(next, at::MemoryFormat::Contiguous);
        stage.bwd_ms = time_ms(
            options, device, [&] { kept_out = run(timing); },
            [&] { torch::autograd::backward({kept_out}, {grad_out}); });
        kept_out = torch::Tensor();
      }
    }
    result.chain.stages.push_back(stage);
    x = next;
  }
  if (options.loss()) {
    const torch::Tensor output = x.detach().requires_grad_(true);
    x = torch::Tensor();
    synchronize(device);
    PeakScope scope(tracker);
    try {
      torch::Tensor value = options.loss()(output);
      if (!value.defined() || value.numel() != 1)
        throw ProfileError("the loss function returned " +
                           (value.defined() ? "a tensor of shape " + c10::str(value.sizes())
                                            : std::string("an undefined tensor")) +
                           ", not one value");
      torch::autograd::backward({value});
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const ProfileError&) {
      throw;
    } catch (const std::exception& error) {
      throw ProfileError(std::string("the loss function failed on the chain's output: ") + error.what());
    }
    synchronize(device);
    result.chain.loss_tmp_bytes =
        std::max<std::int64_t>(0, scope.peak_above_start() - storage_bytes({output.grad()}));
  }
  if (options.progress()) options.progress()(length, length, "");
  result.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  result.chain.validate("profile");
  return result;
}

namespace detail {

namespace {
// The root of a stage's backward: hands over the gradient it holds, once, to the output's
// grad_fn. The engine starts it with an empty seed (what it is given as root inputs stays
// referenced by the caller until the backward ends: zero bytes, not the gradient).
struct GradientSource : torch::autograd::Node {
  GradientSource(torch::autograd::Edge next, torch::Tensor gradient)
      : torch::autograd::Node(torch::autograd::edge_list{std::move(next)}),
        gradient_(std::move(gradient)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override {
    torch::autograd::variable_list out{std::move(gradient_)};
    gradient_ = torch::Tensor();
    return out;
  }
  std::string name() const override { return "remat::GradientSource"; }
  torch::Tensor gradient_;
};
}  // namespace

void run_backward(torch::autograd::Edge edge, torch::Tensor gradient) {
  const torch::Tensor seed = torch::empty({0}, gradient.options().requires_grad(false));
  auto source = std::make_shared<GradientSource>(std::move(edge), std::move(gradient));
  source->add_input_metadata(seed);
  torch::autograd::Engine::get_default_engine().execute(
      {torch::autograd::Edge(std::move(source), 0)}, {seed}, /*keep_graph=*/false,
      /*create_graph=*/false, /*accumulate_grad=*/true);
}

}  // namespace detail
}  // namespace remat
