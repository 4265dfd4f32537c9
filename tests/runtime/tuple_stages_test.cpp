// Stages that pass tuples of tensors, take context, are TorchScript or plain callables: every
// kind trains under remat exactly as plain autograd trains it (outputs, input and parameter
// gradients, BatchNorm statistics updated once, dropout masks replayed), and the U-Net's
// carried skips cost what plain autograd's do.
#include <torch/script.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "remat/core.h"
#include "remat/core/stage_input.h"
#include "remat/runtime.h"
#include "remat/solver.h"

namespace nn = torch::nn;
using remat::NamedStage;
using remat::Tensors;

namespace {

// ---- A U-Net whose skips travel as carried members --------------------------------------

nn::Sequential conv_bn_relu(int in, int out) {
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).bias(false)),
                        nn::BatchNorm2d(out), nn::ReLU());
}

// The input stage: image -> h1.
struct StemImpl : nn::Module {
  explicit StemImpl(int c) : body(register_module("body", conv_bn_relu(3, c))) {}
  torch::Tensor forward(const torch::Tensor& x) { return body->forward(x); }
  nn::Sequential body;
};
TORCH_MODULE(Stem);

// Down: (x, skips...) -> (conv(pool(x)), x, skips...): x becomes a skip, used here and carried.
struct DownImpl : nn::Module {
  DownImpl(int in, int out, double dropout)
      : body(register_module("body", conv_bn_relu(in, out))),
        drop(register_module("drop", nn::Dropout(dropout))) {}
  Tensors forward(const torch::Tensor& x, const torch::Tensor& s1 = {}) {
    Tensors out{drop(body->forward(torch::max_pool2d(x, 2))), x};
    if (s1.defined()) out.push_back(s1);
    return out;
  }
  FORWARD_HAS_DEFAULT_ARGS({1, nn::AnyValue(torch::Tensor())})
  nn::Sequential body;
  nn::Dropout drop;
};
TORCH_MODULE(Down);

// Middle: (x, s2, s1) -> (conv(x), s2, s1): both skips carried, unused.
struct MiddleImpl : nn::Module {
  explicit MiddleImpl(int c) : body(register_module("body", conv_bn_relu(c, c))) {}
  Tensors forward(const torch::Tensor& x, const torch::Tensor& s2, const torch::Tensor& s1) {
    return {body->forward(x), s2, s1};
  }
  nn::Sequential body;
};
TORCH_MODULE(Middle);

// Up: (x, skip, rest...) -> (conv(cat(upsample(x), skip)), rest...): the skip is consumed.
struct UpImpl : nn::Module {
  UpImpl(int in, int out) : body(register_module("body", conv_bn_relu(in, out))) {}
  Tensors forward(const torch::Tensor& x, const torch::Tensor& skip,
                  const torch::Tensor& rest = {}) {
    const torch::Tensor up = torch::upsample_nearest2d(x, {skip.size(2), skip.size(3)});
    // Reserved, not made of an initializer list and grown: GCC 12 then wrongly warns that
    // growing reads past the list's one tensor (-Warray-bounds, in c10's intrusive_ptr).
    Tensors out;
    out.reserve(2);
    out.push_back(body->forward(torch::cat({up, skip}, 1)));
    if (rest.defined()) out.push_back(rest);
    return out;
  }
  FORWARD_HAS_DEFAULT_ARGS({2, nn::AnyValue(torch::Tensor())})
  nn::Sequential body;
};
TORCH_MODULE(Up);

std::vector<NamedStage> unet() {
  const int c = 4;
  return {{"stem", nn::AnyModule(Stem(c))},
          {"down1", nn::AnyModule(Down(c, 2 * c, 0.2))},
          {"down2", nn::AnyModule(Down(2 * c, 4 * c, 0.0))},
          {"middle", nn::AnyModule(Middle(4 * c))},
          {"up2", nn::AnyModule(Up(4 * c + 2 * c, 2 * c))},
          {"up1", nn::AnyModule(Up(2 * c + c, c))},
          {"head", nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(c, 2, 1)))}};
}

// ---- A transformer over token ids with an attention mask as context ---------------------

struct TransformerBlockImpl : nn::Module {
  TransformerBlockImpl(int features, int heads)
      : heads_(heads),
        norm1(register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({features})))),
        qkv(register_module("qkv", nn::Linear(features, 3 * features))),
        proj(register_module("proj", nn::Linear(features, features))),
        norm2(register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({features})))),
        fc1(register_module("fc1", nn::Linear(features, 2 * features))),
        fc2(register_module("fc2", nn::Linear(2 * features, features))),
        drop(register_module("drop", nn::Dropout(0.1))) {}
  // mask: (n, n) booleans, true where attention is allowed.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const auto b = x.size(0), n = x.size(1), f = x.size(2);
    const auto parts = qkv(norm1(x)).view({b, n, 3, heads_, f / heads_}).permute({2, 0, 3, 1, 4});
    torch::Tensor scores =
        torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(f / heads_);
    scores = scores.masked_fill(mask.logical_not(), -1e9);
    const torch::Tensor mixed = torch::matmul(drop(torch::softmax(scores, -1)), parts[2]);
    const torch::Tensor h = x + proj(mixed.transpose(1, 2).reshape({b, n, f}));
    return h + drop(fc2(torch::gelu(fc1(norm2(h)))));
  }
  int heads_;
  nn::LayerNorm norm1;
  nn::Linear qkv, proj;
  nn::LayerNorm norm2;
  nn::Linear fc1, fc2;
  nn::Dropout drop;
};
TORCH_MODULE(TransformerBlock);

std::vector<NamedStage> masked_transformer() {
  const int features = 16, vocabulary = 50;
  return {{"embed", nn::AnyModule(nn::Embedding(vocabulary, features))},
          {"block1", remat::module_stage(nn::AnyModule(TransformerBlock(features, 2)),
                                         /*takes_context=*/true)},
          {"block2", remat::module_stage(nn::AnyModule(TransformerBlock(features, 2)),
                                         /*takes_context=*/true)},
          {"norm", nn::AnyModule(nn::LayerNorm(nn::LayerNormOptions({features})))},
          {"head", nn::AnyModule(nn::Linear(features, vocabulary))}};
}

// ---- A TorchScript stage and a callable stage --------------------------------------------

// A block as a user would script it in Python and save: Linear, BatchNorm, ReLU, dropout, with
// parameters, buffers and a training flag. Defined here from TorchScript source, saved and
// loaded back, as torch.jit.script(block).save() and torch::jit::load() would.
std::shared_ptr<torch::jit::Module> scripted_block(int features) {
  torch::jit::Module m("ScriptedBlock");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("weight", torch::randn({features, features}) / std::sqrt(features), false);
  m.register_parameter("bn_weight", torch::ones({features}), false);
  m.register_parameter("bn_bias", torch::zeros({features}), false);
  m.register_buffer("running_mean", torch::zeros({features}));
  m.register_buffer("running_var", torch::ones({features}));
  m.define(R"(
    def forward(self, x):
        h = torch.matmul(x, self.weight)
        h = torch.batch_norm(h, self.bn_weight, self.bn_bias, self.running_mean, self.running_var,
                             self.training, 0.1, 1e-5, False)
        return torch.dropout(torch.relu(h), 0.25, self.training)
  )");
  std::stringstream file;
  m.save(file);
  return std::make_shared<torch::jit::Module>(torch::jit::load(file));
}

struct CallableParts {
  torch::Tensor weight, bias, running_mean, running_var;
};

// A stage written as a function of declared tensors: batch norm with its own statistics, GELU,
// dropout, a matrix product.
std::shared_ptr<remat::StageModule> callable_block(int features) {
  auto parts = std::make_shared<CallableParts>();
  parts->weight = (torch::randn({features, features}) / std::sqrt(features)).requires_grad_(true);
  parts->bias = torch::zeros({features}).requires_grad_(true);
  parts->running_mean = torch::zeros({features});
  parts->running_var = torch::ones({features});
  return remat::callable_stage(
      [parts](const Tensors& x, const Tensors&) {
        torch::Tensor h = torch::batch_norm(x[0], {}, {}, parts->running_mean, parts->running_var,
                                            /*training=*/true, 0.1, 1e-5, false);
        h = torch::dropout(torch::gelu(h), 0.3, /*train=*/true);
        return Tensors{torch::addmm(parts->bias, h, parts->weight)};
      },
      {parts->weight, parts->bias}, {parts->running_mean, parts->running_var});
}

std::vector<NamedStage> script_and_callable() {
  const int features = 12;
  return {{"in", nn::AnyModule(nn::Linear(6, features))},
          {"scripted", remat::script_stage(scripted_block(features))},
          {"callable", callable_block(features)},
          {"out", nn::AnyModule(nn::Linear(features, 3))}};
}

// ---- A chain whose first activation is much wider than the others -----------------------

std::vector<NamedStage> wide_then_narrow() {
  // Padding's backward hands its input a view of the wider gradient.
  const auto pad = [](const torch::Tensor& x) { return torch::constant_pad_nd(x, {0, 8}); };
  return {
      {"widen", nn::AnyModule(nn::Linear(6, 512))}, {"wide tanh", nn::AnyModule(nn::Tanh())},
      {"pad", nn::AnyModule(nn::Functional(pad))},  {"narrow", nn::AnyModule(nn::Linear(520, 4))},
      {"tanh", nn::AnyModule(nn::Tanh())},          {"out", nn::AnyModule(nn::Linear(4, 3))}};
}

// ---- A skip that the stage carrying it also reads twice -----------------------------------

// "square" returns (h * h, h): h's gradient is then the passed one (from "add", which reads the
// skip) plus the two the product gives. Plain autograd adds them as they arrive, passed first:
// ((passed + a) + b); summed apart, passed + (a + b), the gradient was one bit off.
std::vector<NamedStage> skip_read_twice() {
  const int features = 16;
  const auto carry_on = [](const Tensors& x, const Tensors&) {
    return Tensors{torch::tanh(x[0]), x[1]};
  };
  return {{"in", nn::AnyModule(nn::Linear(6, features))},
          {"square", remat::callable_stage([](const Tensors& x, const Tensors&) {
             return Tensors{x[0] * x[0], x[0]};
           })},
          {"tanh1", remat::callable_stage(carry_on)},
          {"tanh2", remat::callable_stage(carry_on)},
          {"add", remat::callable_stage([](const Tensors& x, const Tensors&) {
             // Not `+ x[1]`: the addition would hand the skip the output's own gradient, one
             // storage for two members, which the chain counts twice (an overstatement). The
             // tanh first, as Python would: in `tanh(x[0]) + x[1] * 2.0` GCC makes the product
             // first, so the tanh's backward runs first and frees the saved output before the
             // product's gradient is made; the backward's peak is then below what the stage
             // holds at its start, a negative temporary that the chain counts as 0 (620 bytes
             // over, docs/cost-model.md).
             const torch::Tensor t = torch::tanh(x[0]);
             const torch::Tensor twice = x[1] * 2.0;
             return Tensors{t + twice};
           })},
          {"out", nn::AnyModule(nn::Linear(features, 3))}};
}

// Appends `count` stages of tanh, each keeping its output: recomputing them saves memory.
void add_tanh_stages(std::vector<NamedStage>& stages, int count) {
  for (int k = 1; k <= count; ++k)
    stages.push_back(
        {"tanh" + std::to_string(k), remat::callable_stage([](const Tensors& x, const Tensors&) {
           return Tensors{torch::tanh(x[0])};
         })});
}

// A stage whose backward hands the stage before a permuted gradient (a transpose's), which
// that stage's backward (a view's: a reshape of the gradient) copies: a copy of y_1 above what
// a backward measured from a plain gradient takes, B_proj's peak the step's at the least
// budget (measured from plain gradients, the least budget was 48 KiB below the step's peak).
// In a channels-last network the same comes from the permutes around each block.
std::vector<NamedStage> permuted_gradient() {
  nn::Linear proj(8, 64), head(16, 4);
  std::vector<NamedStage> stages{
      {"proj", remat::callable_stage(
                   [proj = proj.ptr()](const Tensors& x, const Tensors&) {
                     return Tensors{proj->forward(x[0]).view({-1, 8, 8})};
                   },
                   proj->parameters())},
      {"turn", remat::callable_stage([](const Tensors& x, const Tensors&) {
         return Tensors{x[0].transpose(1, 2).narrow(1, 0, 2) * 2.0};
       })}};
  add_tanh_stages(stages, 10);
  stages.push_back({"head", remat::callable_stage(
                                [head = head.ptr()](const Tensors& x, const Tensors&) {
                                  return Tensors{head->forward(x[0].reshape({-1, 16}))};
                                },
                                head->parameters())});
  return stages;
}

// A BatchNorm right before a concatenation, a stage apart (GhostNet's module as the automatic
// split cuts it): the concatenation's backward hands the BatchNorm's a slice of its gradient,
// with a gap between the batch's images. BatchNorm's CPU backward has a kernel of its own for a
// contiguous gradient, which sums in another order: where the runtime kept a contiguous copy
// of the slice, the gradients differed from plain autograd's (ghostnet_050 and hgnetv2_b0 as
// they come). Its copy keeps the gap (compact_gradient), a few bytes that the chain counts.
std::vector<NamedStage> batchnorm_into_concatenation() {
  nn::Conv2d conv(nn::Conv2dOptions(3, 8, 3).padding(1));
  nn::Conv2d cheap(nn::Conv2dOptions(8, 8, 3).padding(1).groups(8));
  nn::BatchNorm2d norm(8);
  nn::Linear head(16 * 9 * 9, 4);
  std::vector<torch::Tensor> ghost_parameters = cheap->parameters();
  for (const torch::Tensor& p : norm->parameters()) ghost_parameters.push_back(p);
  std::vector<NamedStage> stages{
      {"conv", remat::callable_stage(
                   [conv = conv.ptr()](const Tensors& x, const Tensors&) {
                     return Tensors{conv->forward(x[0])};
                   },
                   conv->parameters())},
      {"ghost", remat::callable_stage(
                    [cheap = cheap.ptr(), norm = norm.ptr()](const Tensors& x, const Tensors&) {
                      const torch::Tensor primary = torch::relu(x[0]);
                      return Tensors{primary, norm->forward(cheap->forward(primary))};
                    },
                    ghost_parameters, norm->buffers())},
      {"cat", remat::callable_stage([](const Tensors& x, const Tensors&) {
         return Tensors{torch::cat({x[0], x[1]}, 1)};
       })}};
  add_tanh_stages(stages, 6);
  stages.push_back({"head", remat::callable_stage(
                                [head = head.ptr()](const Tensors& x, const Tensors&) {
                                  return Tensors{head->forward(x[0].flatten(1))};
                                },
                                head->parameters())});
  return stages;
}

// ---- The comparison ----------------------------------------------------------------------

struct Model {
  std::string name;
  std::function<std::vector<NamedStage>()> make;
  Tensors inputs, context;
};

struct StepResult {
  Tensors outputs, input_grads, state;
};

Tensors plain_forward(const std::vector<NamedStage>& stages, const Tensors& inputs,
                      const Tensors& context) {
  Tensors x = inputs;
  for (const NamedStage& stage : stages) x = stage.module->forward(x, context);
  return x;
}

// The loss of every floating output member (sums of squares and means: a gradient that is a
// full tensor made inside the graph).
torch::Tensor loss_of(const Tensors& outputs) {
  torch::Tensor loss = torch::zeros({});
  for (const torch::Tensor& o : outputs)
    if (o.is_floating_point()) loss = loss + (o * o).sum() + o.mean();
  return loss;
}

Tensors inputs_for_training(const Tensors& inputs) {
  Tensors x;
  for (const torch::Tensor& t : inputs)
    x.push_back(t.is_floating_point() ? t.clone().requires_grad_(true) : t.clone());
  return x;
}

// Two training steps (gradients accumulate, statistics move twice) with `forward`.
template <class Forward>
StepResult train(remat::Checkpointable& chk, Forward forward, const Model& model) {
  torch::manual_seed(5);
  StepResult r;
  const Tensors x = inputs_for_training(model.inputs);
  for (int step = 0; step < 2; ++step) {
    Tensors out = forward(x, model.context);
    loss_of(out).backward();
    r.outputs.clear();
    for (const torch::Tensor& o : out) r.outputs.push_back(o.detach().clone());
  }
  for (const torch::Tensor& t : x)
    r.input_grads.push_back(t.requires_grad() ? t.grad().clone() : torch::Tensor());
  for (const auto& p : chk->parameters())
    r.state.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  for (const auto& b : chk->buffers()) r.state.push_back(b.clone());
  return r;
}

void check_equal(const StepResult& a, const StepResult& b) {
  for (const auto* lists : {&a.outputs, &a.input_grads, &a.state}) {
    const Tensors& x = *lists;
    const Tensors& y = lists == &a.outputs       ? b.outputs
                       : lists == &a.input_grads ? b.input_grads
                                                 : b.state;
    REQUIRE(x.size() == y.size());
    for (std::size_t k = 0; k < x.size(); ++k) {
      INFO((lists == &a.outputs       ? "output "
            : lists == &a.input_grads ? "input gradient "
                                      : "state tensor ")
           << k);
      REQUIRE(x[k].defined() == y[k].defined());
      if (x[k].defined()) CHECK(torch::equal(x[k], y[k]));
    }
  }
}

std::vector<Model> models() {
  torch::manual_seed(3);
  std::vector<Model> out;
  out.push_back({"U-Net with carried skips", unet, {torch::randn({2, 3, 16, 16})}, {}});
  const torch::Tensor ids = torch::randint(0, 50, {3, 10}, torch::kLong);
  const torch::Tensor causal = torch::ones({10, 10}, torch::kBool).tril();
  out.push_back(
      {"transformer on token ids with a mask context", masked_transformer, {ids}, {causal}});
  out.push_back(
      {"TorchScript and callable stages", script_and_callable, {torch::randn({8, 6})}, {}});
  out.push_back(
      {"a skip its stage also reads twice", skip_read_twice, {torch::randn({16, 6})}, {}});
  out.push_back({"a backward that copies a permuted gradient",
                 permuted_gradient,
                 {torch::randn({256, 8})},
                 {}});
  out.push_back({"a BatchNorm right before a concatenation",
                 batchnorm_into_concatenation,
                 {torch::randn({4, 3, 9, 9})},
                 {}});
  return out;
}

// Peak activation memory of one training step above what was live before it (the inputs and
// the context are copies made inside, as the chain counts them).
template <class Forward>
std::int64_t step_peak(Forward forward, const Model& model) {
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  const std::int64_t base = tracker.live();
  tracker.reset_peak();
  {
    torch::manual_seed(5);
    const Tensors x = inputs_for_training(model.inputs);
    Tensors context;  // counted too, as the chain counts it
    for (const torch::Tensor& c : model.context) context.push_back(c.clone());
    torch::Tensor loss = loss_of(forward(x, context));  // the outputs go here
    loss.backward();
  }
  return tracker.peak() - base;
}

}  // namespace

TEST_CASE("stages with tuples, context, TorchScript and callables train exactly as plain autograd",
          "[runtime]") {
  torch::set_num_threads(1);  // one thread: the same reduction order in every run
  for (const Model& model : models()) {
    SECTION(model.name) {
      torch::manual_seed(11);
      remat::Checkpointable reference(model.make());
      const StepResult plain = train(
          reference,
          [&](const Tensors& x, const Tensors& c) {
            return plain_forward(reference->stages(), x, c);
          },
          model);

      torch::manual_seed(11);
      remat::Checkpointable probe(model.make());
      const remat::Chain chain =
          probe->measure(inputs_for_training(model.inputs), model.context,
                         remat::ProfileOptions().measure_time(false).loss(loss_of));
      const std::int64_t full = remat::store_all_peak(chain);
      const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0));
      REQUIRE(least < full);
      for (const std::int64_t budget : {least, (least + full) / 2, full}) {
        DYNAMIC_SECTION("budget " << budget) {
          torch::manual_seed(11);
          remat::Checkpointable chk(model.make());
          chk->set_chain(chain);
          const remat::Solution& s =
              chk->compute_sequence(budget + remat::runtime_reserve_bytes(torch::kCPU));
          INFO(remat::collapsed_string(s.sequence));
          check_equal(
              plain,
              train(
                  chk, [&](const Tensors& x, const Tensors& c) { return chk->forward(x, c); },
                  model));
        }
      }
    }
  }
}

TEST_CASE("tuple stages: store-all peaks as plain autograd, schedules within their budget",
          "[runtime]") {
  torch::set_num_threads(1);
  for (const Model& model : models()) {
    SECTION(model.name) {
      torch::manual_seed(11);
      remat::Checkpointable chk(model.make());
      for (auto& p : chk->parameters()) p.mutable_grad() = torch::zeros_like(p);
      const std::int64_t plain = step_peak(
          [&](const Tensors& x, const Tensors& c) { return plain_forward(chk->stages(), x, c); },
          model);
      // step_peak lets the output go once the loss has its value: measured so.
      const remat::Chain& chain = chk->measure(
          inputs_for_training(model.inputs), model.context,
          remat::ProfileOptions().measure_time(false).loss(loss_of).output_held(false));
      const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
      const std::int64_t full = remat::store_all_peak(chain);
      chk->compute_sequence(full + kR, remat::Algorithm::kStoreAll);
      const std::int64_t store_all =
          step_peak([&](const Tensors& x, const Tensors& c) { return chk->forward(x, c); }, model);
      INFO(model.name << ": plain " << plain << ", store-all predicted " << full << ", measured "
                      << store_all);
      // The caller's loss holds scalars that the chain does not count (its value and backward's
      // seed: 8 bytes), and the loss measured by the profiler a few that the step does not
      // hold at its peak. The model runs the loss as one operation holding x_L while it makes
      // y_L; where autograd lets x_L go first (LibTorch 1.13's transformer here), the
      // prediction is above by x_L.
      constexpr std::int64_t kLossScalars = 8;
      CHECK(store_all == plain);
      CHECK(store_all <= full + kLossScalars);
      CHECK(full - store_all <= chain.activation_bytes(chain.length()) + 32);

      const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0));
      for (const std::int64_t budget : {least, (least + full) / 2, (least + 3 * full) / 4}) {
        const remat::Solution& s = chk->compute_sequence(budget + kR);
        REQUIRE(s.ok());
        const std::int64_t measured = step_peak(
            [&](const Tensors& x, const Tensors& c) { return chk->forward(x, c); }, model);
        INFO("budget " << budget << ": predicted " << s.peak_bytes << ", measured " << measured
                       << "\n"
                       << remat::collapsed_string(s.sequence));
        CHECK(measured <= budget + kR);
        // The simulator counts each storage once: its prediction is exact, carried skips
        // included (the caller's loss holds two scalars that the chain does not count).
        CHECK(measured == s.peak_bytes - kR + kLossScalars);  // peak_bytes includes the reserve
      }
    }
  }
}

namespace {

// The engine calls a step's backward makes, found from the sequence: one per backward B_i,
// less one for each B_i that directly follows B_{i+1} where neither x_{i+1} nor x_{i+2} has a
// member carried through with a gradient (a gradient the runtime sums itself, from two
// stages).
int expected_backward_calls(const remat::Chain& chain, const remat::Sequence& sequence) {
  const auto sums = [&](int k) {
    for (const remat::Member& m : chain.members(k))
      if (m.carried() && m.grad) return true;
    return false;
  };
  int calls = 0;
  for (std::size_t k = 0; k < sequence.size(); ++k) {
    const remat::Op& op = sequence[k];
    if (op.kind != remat::OpKind::kBackward) continue;
    const bool joins = k > 0 && sequence[k - 1].kind == remat::OpKind::kBackward &&
                       sequence[k - 1].stage == op.stage + 1 && !sums(op.stage + 1) &&
                       !sums(op.stage + 2);
    calls += joins ? 0 : 1;
  }
  return calls;
}

}  // namespace

TEST_CASE("consecutive backwards run in one engine call, as exact as a call per stage",
          "[runtime]") {
  torch::set_num_threads(1);
  std::vector<Model> all = models();
  // Its backward peaks at the first stage, where x_1's gradient, as wide as x_1, has been
  // passed on within the engine call; padding's backward makes a view of a larger gradient,
  // which is copied as a call per stage copies it.
  all.push_back(
      {"a wide activation, then narrow ones", wide_then_narrow, {torch::randn({8, 6})}, {}});
  for (const Model& model : all) {
    SECTION(model.name) {
      torch::manual_seed(11);
      remat::Checkpointable probe(model.make());
      const remat::Chain chain = probe->measure(
          inputs_for_training(model.inputs), model.context,
          remat::ProfileOptions().measure_time(false).loss(loss_of).output_held(false));
      bool carried_gradients = false;
      for (int k = 0; k <= chain.length(); ++k)
        for (const remat::Member& m : chain.members(k)) carried_gradients |= m.carried() && m.grad;
      const std::int64_t kR = remat::runtime_reserve_bytes(torch::kCPU);
      const std::int64_t full = remat::store_all_peak(chain);
      const std::int64_t least = remat::min_feasible_budget(chain, remat::SolveOptions(0));
      std::vector<std::int64_t> budgets{full};
      if (least < full) budgets.insert(budgets.begin(), {least, (least + full) / 2});
      for (const std::int64_t budget : budgets) {
        DYNAMIC_SECTION("budget " << budget) {
          StepResult results[2];
          std::int64_t calls[2], peaks[2];
          remat::Sequence sequence;
          for (const bool fused : {true, false}) {
            const remat::detail::FuseBackwardCalls setting(fused);
            torch::manual_seed(11);
            remat::Checkpointable chk(model.make());
            chk->set_chain(chain);
            const remat::Solution& s =
                chk->compute_sequence(budget + kR, budget == full ? remat::Algorithm::kStoreAll
                                                                  : remat::Algorithm::kOptimal);
            REQUIRE(s.ok());
            sequence = s.sequence;
            const std::int64_t before = remat::detail::backward_calls();
            results[fused] = train(
                chk, [&](const Tensors& x, const Tensors& c) { return chk->forward(x, c); }, model);
            calls[fused] = remat::detail::backward_calls() - before;
            // A third step, its parameter gradients already allocated as in the two above.
            peaks[fused] = step_peak(
                [&](const Tensors& x, const Tensors& c) { return chk->forward(x, c); }, model);
          }
          INFO(remat::collapsed_string(sequence));
          check_equal(results[true], results[false]);
          CHECK(peaks[true] == peaks[false]);
          const auto backwards =
              std::count_if(sequence.begin(), sequence.end(),
                            [](const auto& op) { return op.kind == remat::OpKind::kBackward; });
          CHECK(calls[false] == 2 * backwards);  // two steps
          CHECK(calls[true] == 2 * expected_backward_calls(chain, sequence));
          if (budget == full && !carried_gradients) CHECK(calls[true] == 2);  // as plain autograd
          if (carried_gradients) CHECK(calls[true] > 2);
        }
      }
    }
  }
}

namespace {

// A stage whose backward takes at least kSlowMs.
constexpr int kSlowMs = 25;
struct SlowBackward : torch::autograd::Function<SlowBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kSlowMs));
    return grads;
  }
};

}  // namespace

TEST_CASE("a traced step times each operation where it runs, and sums as the step does",
          "[runtime]") {
  using Clock = std::chrono::steady_clock;
  torch::manual_seed(5);
  nn::Linear first(16, 16), last(16, 4);
  std::vector<NamedStage> stages;
  stages.push_back({"linear", nn::AnyModule(first)});
  stages.push_back({"slow forward", remat::callable_stage([](const Tensors& x, const Tensors&) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(kSlowMs));
                      return Tensors{torch::tanh(x[0])};
                    })});
  stages.push_back({"slow backward", remat::callable_stage([](const Tensors& x, const Tensors&) {
                      return Tensors{SlowBackward::apply(x[0]) * 2};
                    })});
  stages.push_back({"head", nn::AnyModule(last)});
  remat::Checkpointable chk(stages);
  const torch::Tensor x = torch::randn({8, 16});
  chk->measure({x}, {}, remat::ProfileOptions().repeat(1).warmup(1).min_repetition_ms(0));
  const auto step = [&] {
    const Clock::time_point start = Clock::now();
    chk->forward({x}, {})[0].pow(2).sum().backward();
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };

  SECTION("recompute-all: each forward of the slow stage, the first and the recomputation") {
    REQUIRE(chk->compute_sequence(std::int64_t{1} << 30, remat::Algorithm::kRecomputeAll).ok());
    const remat::Sequence& sequence = chk->sequence();
    INFO(remat::collapsed_string(sequence));
    step();
    CHECK(chk->last_trace().empty());  // not asked for
    chk->trace_next_step();
    const double wall_ms = step();
    const std::vector<remat::TracedOperation> trace = chk->last_trace();
    REQUIRE(!trace.empty());
    CHECK(trace.front().first == 0);
    CHECK(trace.back().last + 1 == sequence.size());
    const std::vector<remat::OpRecord>& predicted = chk->solution().simulation.trace;
    const std::vector<std::string> names = remat::op_strings(sequence);
    int slow_forwards = 0, slow_backwards = 0, recomputations = 0;
    double measured_ms = 0;
    bool after_loss = false;
    for (std::size_t k = 0; k < trace.size(); ++k) {
      const remat::TracedOperation& op = trace[k];
      INFO("entry " << k << ": operations " << op.first << " to " << op.last << ", from "
                    << op.start_ms << " ms, " << op.measured_ms << " ms");
      REQUIRE(op.first <= op.last);
      if (k > 0) {
        CHECK(op.first == trace[k - 1].last + 1);
        CHECK(op.start_ms >= trace[k - 1].start_ms + trace[k - 1].measured_ms);
      }
      double expected = 0;
      for (std::size_t p = op.first; p <= op.last; ++p) {
        expected += predicted[p].end_ms - predicted[p].start_ms;
        if (p > op.first) {  // only consecutive backwards share an entry
          CHECK(sequence[p].kind == remat::OpKind::kBackward);
          CHECK(sequence[p].stage == sequence[p - 1].stage - 1);
        }
        if (sequence[p].kind == remat::OpKind::kBackward && sequence[p].stage == 2) {
          ++slow_backwards;
          CHECK(op.measured_ms >= kSlowMs);
        }
      }
      CHECK(op.predicted_ms == Approx(expected));
      const remat::Op& head = sequence[op.first];
      CHECK(op.label == (op.first == op.last ? names[op.first]
                                             : names[op.first] + ".." +
                                                   std::to_string(sequence[op.last].stage)));
      using Kind = remat::TracedOperation::Kind;
      CHECK(op.kind == (head.kind == remat::OpKind::kLoss       ? Kind::kLoss
                        : head.kind == remat::OpKind::kBackward ? Kind::kBackward
                        : after_loss                            ? Kind::kRecomputation
                                                                : Kind::kForward));
      if (head.is_forward() && after_loss) ++recomputations;
      if (head.kind == remat::OpKind::kLoss) after_loss = true;
      if (head.is_forward() && head.stage == 1) {
        ++slow_forwards;
        CHECK(op.measured_ms >= kSlowMs);
      }
      measured_ms += op.measured_ms;
    }
    const auto forwards_of = [&](int stage) {
      return std::count_if(sequence.begin(), sequence.end(), [&](const remat::Op& op) {
        return op.is_forward() && op.stage == stage;
      });
    };
    CHECK(slow_forwards == forwards_of(1));
    CHECK(slow_forwards >= 2);  // the first forward, and at least one recomputation
    CHECK(slow_backwards == 1);
    // Times are intervals of the step, not running totals: they fit in it.
    CHECK(measured_ms <= wall_ms);
    CHECK(trace.back().start_ms + trace.back().measured_ms <= wall_ms);

    const remat::TraceSummary summary = remat::summarize_trace(trace);
    CHECK(summary.recompute.operations == recomputations);
    CHECK(summary.forward.operations + summary.recompute.operations ==
          chk->solution().simulation.nograd_forwards + chk->solution().simulation.grad_forwards);
    CHECK(summary.loss.operations == 1);
    CHECK(summary.forward.measured_ms >= kSlowMs);
    CHECK(summary.recompute.measured_ms >= kSlowMs);
    CHECK(summary.backward.measured_ms >= kSlowMs);
    CHECK(summary.predicted_ms == Approx(chk->solution().makespan_ms).epsilon(1e-9));
    CHECK(summary.measured_ms == Approx(summary.forward.measured_ms + summary.loss.measured_ms +
                                        summary.recompute.measured_ms +
                                        summary.backward.measured_ms + summary.between_ms));
    CHECK(summary.measured_ms + summary.caller_ms ==
          Approx(trace.back().start_ms + trace.back().measured_ms));
    CHECK(summary.between_ms >= 0);
    CHECK(summary.caller_ms >= 0);

    // The steps after it are not traced: the trace stays the traced step's.
    step();
    REQUIRE(chk->last_trace().size() == trace.size());
    CHECK(chk->last_trace().front().measured_ms == trace.front().measured_ms);
  }

  SECTION("store-all: the backward is one entry, one engine call") {
    REQUIRE(chk->compute_sequence(std::int64_t{1} << 30, remat::Algorithm::kStoreAll).ok());
    chk->trace_next_step();
    step();
    const std::vector<remat::TracedOperation>& trace = chk->last_trace();
    INFO(remat::collapsed_string(chk->sequence()));
    REQUIRE(trace.size() == 6);  // Fe_0 .. Fe_3, L, B_3..0
    CHECK(trace.back().first == 5);
    CHECK(trace.back().last == 8);
    CHECK(trace.back().measured_ms >= kSlowMs);
    CHECK(trace.back().label == "B_3..0");
    const remat::TraceSummary summary = remat::summarize_trace(trace);
    CHECK(summary.recompute.operations == 0);
    CHECK(summary.backward.operations == 4);
  }
}

// A gradient the runtime keeps holds its storage alone, as the profiler's gradients do, so that
// autograd adds a later contribution into it in place, as measured. A reshape's gradient is a
// view, whose base holds the storage too: autograd would make a new sum instead, a member's
// size above the prediction (tests/python/test_random_chains.py, seed 285).
TEST_CASE("a kept gradient is a plain tensor holding its storage alone", "[runtime][tuple]") {
  torch::Tensor view;
  {
    torch::NoGradGuard no_grad;
    view = torch::randn({4, 6}).reshape({2, 12}).t();  // a view of its base's whole storage
  }
  REQUIRE(view.is_view());
  REQUIRE(view.storage().use_count() == 2);
  const void* data = view.data_ptr();
  const torch::Tensor expected = view.clone();
  const torch::Tensor kept = remat::detail::compact_gradient(std::move(view));
  CHECK(!kept.is_view());
  CHECK(kept.storage().use_count() == 1);
  CHECK(kept.data_ptr() == data);  // the same memory, not a copy
  CHECK(kept.strides() == expected.strides());
  CHECK(torch::equal(kept, expected));
  // A view of part of a larger storage is still copied into its own.
  const torch::Tensor part = remat::detail::compact_gradient(torch::randn({4, 6}).narrow(0, 1, 2));
  CHECK(part.storage().nbytes() == 2 * 6 * sizeof(float));
}

// A slice with gaps (a concatenation's gradient, sliced for one of its inputs) is copied into a
// storage of its own with the same order of strides, the same contiguous runs and gaps, and
// the same alignment, the gaps narrowed: a kernel reading it chooses as it would from the
// slice (BatchNorm's CPU backward sums in another order from a contiguous gradient).
TEST_CASE("a kept gradient sliced with gaps keeps them, narrowed", "[runtime][tuple]") {
  const torch::Tensor whole = torch::randn({4, 40, 3, 3});
  for (const int from : {0, 3, 20}) {
    DYNAMIC_SECTION("channels " << from << " to " << from + 20) {
      const torch::Tensor slice = whole.narrow(1, from, 20);
      const torch::Tensor kept = remat::detail::compact_gradient(slice);
      CHECK(torch::equal(kept, slice));
      CHECK(!kept.is_view());
      CHECK(kept.storage().use_count() == 1);
      CHECK(!kept.is_contiguous());
      CHECK(kept.stride(1) == 9);
      CHECK(kept.stride(2) == 3);
      CHECK(kept.stride(3) == 1);
      // A gap of 20 x 9 elements per image, narrowed to what keeps the alignment: 180 mod 16.
      CHECK(kept.stride(0) == 180 + 180 % 16);
      CHECK(reinterpret_cast<std::uintptr_t>(kept.data_ptr()) % 64 ==
            reinterpret_cast<std::uintptr_t>(slice.data_ptr()) % 64);
      CHECK(kept.storage().nbytes() < whole.storage().nbytes() * 3 / 5);
      // Kept again (passed on over a stage that only carries it): as it is, not a new copy.
      const void* data = kept.data_ptr();
      CHECK(remat::detail::compact_gradient(kept).data_ptr() == data);
    }
  }
  // A gap narrower than the alignment stays; a slice of whole rows is dense: a plain clone.
  const torch::Tensor rows = torch::randn({6, 24}).narrow(1, 2, 8);
  CHECK(remat::detail::compact_gradient(rows).strides() == rows.strides());
  const torch::Tensor dense =
      remat::detail::compact_gradient(torch::randn({6, 24}).narrow(0, 2, 3));
  CHECK(dense.is_contiguous());
  CHECK(dense.storage().nbytes() == 3 * 24 * sizeof(float));
}
