#include "remat/profiler.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <thread>

#include "remat/solver.h"
#include "skip.h"
#include "test_nets.h"

namespace nn = torch::nn;
using remat::ProfileOptions;

namespace {

ProfileOptions quick() { return ProfileOptions().repeat(1).warmup(1).min_repetition_ms(0); }

// Peak activation bytes of one plain training step (store-all), measured by the tracker:
// the input x_0 and every activation, with the gradient of the output given (y_L).
// One plain training step's peak. `keep_output`: the step holds the network's output to its
// end (`out = net(x)`, the loss, its backward); else it lets it go once the loss has its value.
std::int64_t plain_step_peak(nn::Sequential& net, const torch::Tensor& sample, bool keep_output) {
  for (auto& p : net->parameters())
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  torch::Tensor weight;
  {
    torch::NoGradGuard no_grad;
    weight = torch::ones_like(net->forward(sample));
  }
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  const std::int64_t base = tracker.live();
  tracker.reset_peak();
  {
    // The input wants a gradient only if the sample does (the profiler's y_0 likewise).
    torch::Tensor x = sample.detach().clone().requires_grad_(sample.requires_grad());
    // A loss whose gradient y_L is a full tensor made by autograd and held by nobody else,
    // as a real loss's is (nll_loss's gradient is freed once used).
    torch::Tensor out = net->forward(x);
    torch::Tensor loss = (out * weight).sum();
    if (!keep_output) out.reset();
    loss.backward();
  }
  return tracker.peak() - base;
}

// A stage returning a tuple, one returning a non-tensor, one modifying its input in place.
struct PairImpl : nn::Module {
  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) { return {x * 2, x * 3}; }
};
TORCH_MODULE(Pair);
struct TwiceImpl : nn::Module {
  std::vector<torch::Tensor> forward(torch::Tensor x) { return {x, x}; }
};
TORCH_MODULE(Twice);
struct CountImpl : nn::Module {
  int64_t forward(torch::Tensor x) { return x.numel(); }
};
TORCH_MODULE(Count);
struct InPlaceImpl : nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x.mul_(2); }
};
TORCH_MODULE(InPlace);
struct ThrowsImpl : nn::Module {
  torch::Tensor forward(torch::Tensor /*x*/) { throw std::domain_error("the stage's own error"); }
};
TORCH_MODULE(Throws);
struct ViewImpl : nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x.flatten(1); }
};
TORCH_MODULE(View);
// A module taking its members as one list: what a Sequential of tuple stages needs.
struct ScaleFirstImpl : nn::Module, remat::MemberListModule {
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> x) {
    x.at(0) = x[0] * 5;
    return x;
  }
};
TORCH_MODULE(ScaleFirst);

// A forward that lasts about 1 ms (a sleep) and counts its calls, with a backward of a few
// microseconds: the forward is the backward timing's untimed setup.
struct SlowForwardImpl : nn::Module {
  int calls = 0;
  int sleep_ms = 1;
  torch::Tensor forward(torch::Tensor x) {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    return x * 2;
  }
};
TORCH_MODULE(SlowForward);

}  // namespace

TEST_CASE("a repetition counts its untimed setup: a slow forward runs a few times "
          "to time a fast backward, not a thousand",
          "[profiler]") {
  SlowForward slow;
  nn::Sequential net(nn::Linear(4, 4), slow);
  const torch::Tensor sample = torch::randn({2, 4});
  (void)remat::profile(net, sample, ProfileOptions().repeat(5).warmup(1).min_repetition_ms(2));
  // Each quantity: 1 warm-up run, then 5 repetitions of 2 runs (each run lasting over 1 ms,
  // setup included): 11 forwards each for the forward with and without autograd, and 11 as the
  // backward's setup, besides memory's few. Counting only the backward's own microseconds (a
  // few), a repetition was hundreds of runs: over a thousand forwards.
  CHECK(slow->calls < 80);
}

TEST_CASE("measuring bounded by steps times the stages in a few passes, on the CPU too",
          "[profiler]") {
  // A forward of 5 ms (a sleep), counted, between two fast stages: a pass (forward with and
  // without autograd) costs about two of its 5 ms steps, and memory's runs two more forwards.
  const auto forwards = [](double max_steps, int repeat) {
    SlowForward slow;
    slow->sleep_ms = 5;
    nn::Sequential net(nn::Linear(4, 4), slow, nn::Linear(4, 4));
    const remat::Profile p = remat::profile(
        net, torch::randn({2, 4}), ProfileOptions().max_steps(max_steps).repeat(repeat));
    CHECK(p.timing == remat::Timing::kPasses);
    for (const remat::Stage& s : p.chain.stages) CHECK(s.fwd_ms > 0);
    CHECK(p.chain.stages[1].fwd_ms >= 4.5);
    return slow->calls;
  };
  // 3 steps: memory's two forwards, one timed pass (at least one always), and no more: another
  // would take the time spent to about 5 steps.
  CHECK(forwards(3, 5) == 2 + 2);
  CHECK(forwards(0.1, 5) == 2 + 2);
  // A budget of 1000 steps: every pass up to repeat.
  CHECK(forwards(1000, 5) == 2 + 2 * 5);
  CHECK(forwards(1000, 2) == 2 + 2 * 2);
}

TEST_CASE("profiling a conv chain gives a valid chain with exact activation sizes",
          "[profiler]") {
  torch::manual_seed(1);
  nn::Sequential net = remat::test::conv_chain(8, 10, true);
  const torch::Tensor sample = torch::randn({4, 3, 16, 16});
  std::vector<int> progress;
  const remat::Profile p = remat::profile(
      net, sample, quick().progress([&](int stage, int, const std::string&) { progress.push_back(stage); }));
  const remat::Chain& chain = p.chain;
  REQUIRE(chain.length() == 6);
  CHECK(progress == std::vector<int>{0, 1, 2, 3, 4, 5, 6});
  CHECK(chain.input_bytes() == 4 * 3 * 16 * 16 * 4);
  CHECK(chain.stages[0].out_bytes() == 4 * 8 * 16 * 16 * 4);
  CHECK(chain.stages[2].out_bytes() == 4 * 8 * 8 * 8 * 4);  // max pool
  CHECK(chain.stages[5].out_bytes() == 4 * 10 * 4);         // classifier
  CHECK(p.output_shapes[5].front() == std::vector<std::int64_t>{4, 10});
  for (const remat::Stage& s : chain.stages) {
    CHECK(s.fwd_ms > 0);
    CHECK(s.bwd_ms > 0);
    CHECK(s.fwd_nograd_ms.has_value());
  }
  // What each stage's backward keeps, as PyTorch's autograd keeps it. Conv+BN+ReLU: its input
  // (the convolution's), its output (the ReLU's result) and, as state, the convolution's
  // output (for BN's backward) and BN's per-channel statistics.
  const std::vector<int> keep{0}, none{};
  const remat::Stage& block = chain.stages[0];
  CHECK(block.saved_inputs == keep);
  CHECK(block.saved_outputs == keep);
  CHECK(block.state_bytes == block.out_bytes() + 2 * 8 * 4);  // BN's mean and 1/std
  // Max pooling: its input and the argmax indices (int64: twice its float output), not its
  // output.
  CHECK(chain.stages[2].saved_inputs == keep);
  CHECK(chain.stages[2].saved_outputs == none);
  CHECK(chain.stages[2].state_bytes == 2 * chain.stages[2].out_bytes());
  // Dropout: its mask only (a float tensor in LibTorch's implementation), not its input or
  // output.
  CHECK(chain.stages[4].saved_inputs == none);
  CHECK(chain.stages[4].saved_outputs == none);
  CHECK(chain.stages[4].state_bytes == chain.stages[4].out_bytes());
  // The JSON round trip keeps everything.
  const remat::Chain back = remat::parse_chain(remat::chain_to_json(chain));
  CHECK(back.stages[3].kept_bytes() == chain.stages[3].kept_bytes());
}

TEST_CASE("profiling leaves the model exactly as it found it", "[profiler]") {
  torch::manual_seed(2);
  nn::Sequential net = remat::test::conv_chain(4, 5, true);
  const torch::Tensor sample = torch::randn({2, 3, 12, 12});
  // Some gradients present, others absent; one sub-module in eval mode.
  net->parameters()[0].mutable_grad() = torch::randn_like(net->parameters()[0]);
  net[1]->eval();
  const auto state = remat::test::state_of(*net);
  const torch::Tensor grad0 = net->parameters()[0].grad().clone();
  std::vector<bool> modes;
  for (const auto& m : net->modules()) modes.push_back(m->is_training());

  torch::manual_seed(77);
  const torch::Tensor expected_random = torch::rand({8});
  torch::manual_seed(77);
  remat::profile(net, sample, quick().warm_up_on_cpu(GENERATE(false, true)));
  const torch::Tensor random = torch::rand({8});

  CHECK(remat::test::same_tensors(state, remat::test::state_of(*net)));
  CHECK(torch::equal(net->parameters()[0].grad(), grad0));
  for (std::size_t i = 1; i < net->parameters().size(); ++i)
    CHECK_FALSE(net->parameters()[i].grad().defined());
  std::vector<bool> after;
  for (const auto& m : net->modules()) after.push_back(m->is_training());
  CHECK(after == modes);
  CHECK(torch::equal(random, expected_random));  // the generator state is restored
  // BatchNorm statistics really were restored, not merely never touched: one training
  // forward changes them.
  net->train();
  net->forward(sample);
  CHECK_FALSE(remat::test::same_tensors(state, remat::test::state_of(*net)));
}

// A stage whose first call does once what later calls do not, and allocates for it, as
// torch.compile's autotuning of its kernels does on a GPU: its first forward without autograd,
// its first with autograd and its first backward each allocate, and free, a scratch buffer of
// 1 MiB; later calls do not (`spent`: never).
std::atomic<bool> backward_scratch{false};
void scratch() { (void)torch::zeros({1 << 18}); }
struct ScratchOnFirstBackward : torch::autograd::Function<ScratchOnFirstBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const torch::Tensor& x) {
    return x * 2;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    if (backward_scratch.exchange(false)) scratch();
    return {grads[0] * 2};
  }
};
struct FirstCallImpl : nn::Module {
  explicit FirstCallImpl(bool spent) : first_grad(!spent), first_nograd(!spent) {
    backward_scratch = !spent;
  }
  torch::Tensor forward(torch::Tensor x) {
    bool& first = torch::GradMode::is_enabled() ? first_grad : first_nograd;
    if (first) scratch();
    first = false;
    return ScratchOnFirstBackward::apply(x);
  }
  bool first_grad, first_nograd;
};
TORCH_MODULE(FirstCall);

TEST_CASE("a first call's one-time allocations are not counted where the profiler warms up",
          "[profiler]") {
  const torch::Tensor sample = torch::randn({16, 64});
  // The loss's first call allocates its scratch too.
  const auto profile = [&](bool spent, bool warm_up) {
    torch::manual_seed(3);
    nn::Sequential net(nn::Linear(64, 64), FirstCall(spent), nn::Linear(64, 8));
    auto first_loss = std::make_shared<bool>(!spent);
    const remat::LossFunction loss = [first_loss](const remat::Tensors& out) {
      if (*first_loss) scratch();
      *first_loss = false;
      return out[0].square().sum();
    };
    return remat::profile(net, sample,
                          quick().measure_time(false).loss(loss).warm_up_on_cpu(warm_up)).chain;
  };
  const remat::Chain steady = profile(true, false);
  // Warmed up, the profile is the network's as later calls run it: the scratch is not counted.
  CHECK(remat::chain_to_json(profile(false, true)) == remat::chain_to_json(steady));
  CHECK(remat::chain_to_json(profile(true, true)) == remat::chain_to_json(steady));
  // Measured cold (the CPU's default), each first call's scratch is its temporary peak (less
  // what stays live after it: the 4 KiB output, the input's gradient), where the steady
  // profile's temporaries are a few KiB.
  const remat::Chain cold = profile(false, false);
  const std::int64_t mib = 1 << 20, slack = 8 << 10;
  const remat::Stage &first = cold.stages[1], &later = steady.stages[1];
  CHECK(*later.fwd_nograd_tmp_bytes < slack);
  CHECK(*first.fwd_nograd_tmp_bytes >= mib - slack);
  CHECK(later.fwd_tmp_bytes < slack);
  CHECK(first.fwd_tmp_bytes >= mib - slack);
  CHECK(later.bwd_tmp_bytes < slack);
  CHECK(first.bwd_tmp_bytes >= mib - slack);
  CHECK(steady.loss_tmp_bytes < slack);
  CHECK(cold.loss_tmp_bytes >= mib - slack);
}

TEST_CASE("the measured store-all peak equals the simulator's prediction", "[profiler]") {
  // Exact, plus two scalars outside the model: the loss and the seed of its backward.
  constexpr std::int64_t kLossScalars = 2 * 4;
  struct Case {
    const char* name;
    int channels, batch, size;
  };
  // Both ways of writing the step: the output kept to its end (the default), or let go once
  // the loss has its value, measured so (output_held(false)).
  const Case cases[] = {{"small", 4, 2, 12}, {"wider", 16, 4, 16}, {"odd sizes", 6, 3, 21}};
  for (const Case& c : cases) {
    SECTION(c.name) {
      for (const bool held : {false, true}) {
        torch::manual_seed(3);
        nn::Sequential net = remat::test::conv_chain(c.channels, 10, false);
        const torch::Tensor sample = torch::randn({c.batch, 3, c.size, c.size});
        const remat::Chain chain =
            remat::profile(net, sample, quick().measure_time(false).output_held(held)).chain;
        const std::int64_t predicted = remat::store_all_peak(chain);
        const std::int64_t measured = plain_step_peak(net, sample, held);
        INFO("output held " << held << " predicted " << predicted << " measured " << measured);
        CHECK(measured == predicted + kLossScalars);
      }
    }
  }
  SECTION("with a dropout stage, whose output no backward keeps") {
    // The model's peak is the classifier's backward B_{L-1}, which it charges with y_L until
    // the stage's backward ends; autograd frees y_L once the linear layer's backward has used
    // it, before the pooling's makes y_{L-1}: over by y_L (as many bytes as x_L), whether the
    // step keeps the output (then x_L is in both, 120 bytes above) or lets it go.
    for (const bool held : {false, true}) {
      torch::manual_seed(3);
      nn::Sequential net = remat::test::conv_chain(8, 10, true);
      const torch::Tensor sample = torch::randn({3, 3, 20, 20});
      const remat::Chain chain =
          remat::profile(net, sample, quick().measure_time(false).output_held(held)).chain;
      const std::int64_t predicted = remat::store_all_peak(chain);
      const std::int64_t measured = plain_step_peak(net, sample, held);
      INFO("output held " << held << " predicted " << predicted << " measured " << measured);
      CHECK(measured == predicted + kLossScalars - chain.stages.back().out_bytes());
      const int last = chain.length() - 1;
      const remat::Simulation sim =
          remat::simulate(chain, remat::parse_sequence("Fe_0.." + std::to_string(last) + " L B_" +
                                                           std::to_string(last) + "..0",
                                                       chain.length()));
      CHECK(sim.trace[static_cast<std::size_t>(sim.peak_op)].op == remat::bwd(last));
    }
  }
}

TEST_CASE("a stage returning a tuple has one member per tensor", "[profiler]") {
  nn::Sequential net(nn::BatchNorm2d(3), Pair());
  const torch::Tensor sample = torch::randn({2, 3, 4, 4});
  const remat::Profile p = remat::profile(net, sample, quick().measure_time(false));
  const std::vector<remat::Member>& out = p.chain.stages[1].outputs;
  REQUIRE(out.size() == 2);
  CHECK(out[0].bytes == 2 * 3 * 4 * 4 * 4);
  CHECK(out[1].bytes == 2 * 3 * 4 * 4 * 4);
  CHECK_FALSE(out[0].carried());
  CHECK(p.output_shapes[1].size() == 2);
  // A context tensor is never differentiated: one that requires grad is refused.
  CHECK_THROWS_WITH(remat::profile(remat::stages_of(net), {sample},
                                   {torch::ones({2}).requires_grad_(true)}, quick()),
                    Catch::Contains("context tensor 0 requires grad"));
}

TEST_CASE("stage adapters: names, member lists, plain runs", "[profiler]") {
  CHECK(remat::short_type_name("torch::nn::Conv2dImpl") == "Conv2d");
  CHECK(remat::short_type_name("(anonymous namespace)::PairImpl") == "Pair");
  CHECK(remat::short_type_name("a::b::(anonymous namespace)::WrapImpl<a::(anonymous "
                               "namespace)::BlockImpl, std::vector<at::Tensor> >") ==
        "Wrap<Block, vector<Tensor> >");
  CHECK(remat::short_type_name("Impl") == "Impl");

  nn::Sequential net;
  net->push_back(nn::Linear(3, 3));
  net->push_back("split", Pair());
  net->push_back(ScaleFirst());
  const std::vector<remat::NamedStage> stages = remat::stages_of(net);
  REQUIRE(stages.size() == 3);
  CHECK(stages[0].name == "0:Linear");
  CHECK(stages[1].name == "split");
  CHECK(stages[2].name == "2:ScaleFirst");
  // The Sequential passes Pair's tuple as one value: ScaleFirst cannot take it (it takes a
  // list), but as stages, a tuple's members go to a MemberListModule as one list.
  const torch::Tensor x = torch::randn({2, 3});
  const remat::Tensors out = remat::run_stages(stages, {x});
  REQUIRE(out.size() == 2);
  const torch::Tensor y = net[0]->as<nn::Linear>()->forward(x);
  CHECK(torch::equal(out[0], y * 2 * 5));
  CHECK(torch::equal(out[1], y * 3));
  // A list module carries what it returns as it came: the second member is the same tensor.
  const remat::Tensors in = {x, x * 2};
  const remat::Tensors carried = stages[2].module->forward(in, {});
  CHECK(carried[1].is_same(in[1]));
  // And a Sequential of list modules runs by itself.
  nn::Sequential lists{ScaleFirst(), ScaleFirst()};
  CHECK(torch::equal(lists->forward<std::vector<torch::Tensor>>(in)[0], x * 5 * 5));
  // A module returning something else than tensors is a StageError.
  CHECK_THROWS_AS(remat::module_stage(nn::AnyModule(Count()))->forward({x}, {}), remat::StageError);
}

TEST_CASE(
    "a stage whose output is a view of its input keeps no state, and the view counts its own bytes",
    "[profiler]") {
  nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1)), View(),
                     nn::Linear(4 * 8 * 8, 5));
  const torch::Tensor sample = torch::randn({2, 3, 8, 8});
  const remat::Chain chain = remat::profile(net, sample, quick().measure_time(false)).chain;
  const std::int64_t data = 2 * 4 * 8 * 8 * 4;
  CHECK(chain.stages[1].out_bytes() == data);
  // No new storage: no state; the view keeps its base alive, which counts as its own bytes.
  CHECK(chain.stages[1].state_bytes == 0);
  CHECK(chain.stages[1].saved_inputs.empty());
  CHECK(chain.stages[1].saved_outputs.empty());
  CHECK(chain.stages[1].fwd_tmp_bytes == 0);
}

TEST_CASE("a slice of another output member counts its whole storage, which it keeps alive",
          "[profiler]") {
  // "split" returns h and a slice of it; "tail" drops h and carries the slice on: from there
  // the slice alone holds h's whole storage (counted with its own elements, half of it, the
  // step went 4 KiB above its prediction: tests/python/test_random_chains.py).
  const auto split = [](const remat::Tensors& x, const remat::Tensors&) {
    const torch::Tensor h = torch::tanh(x[0]);
    return remat::Tensors{h, h.narrow(1, 0, 32)};
  };
  const auto tail = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{torch::tanh(x[0]) + torch::cat({x[1], x[1]}, 1), x[1]};
  };
  const auto head = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{x[0].sum(1, true) + x[1].sum(1, true)};
  };
  const std::vector<remat::NamedStage> stages{{"split", remat::callable_stage(split)},
                                              {"tail", remat::callable_stage(tail)},
                                              {"head", remat::callable_stage(head)}};
  const torch::Tensor sample = torch::randn({32, 64}).requires_grad_(true);
  const remat::Chain chain =
      remat::profile(stages, {sample}, {}, quick().measure_time(false)).chain;
  const std::int64_t whole = 32 * 64 * 4;
  REQUIRE(chain.stages[0].outputs.size() == 2);
  CHECK(chain.stages[0].outputs[0].bytes == whole);
  CHECK(chain.stages[0].outputs[1].bytes == whole);  // not 32 * 32 * 4
  CHECK(chain.stages[1].outputs[1].carried_from == 1);
}

TEST_CASE("a view of an input member counts what that member keeps alive, where it is more",
          "[profiler]") {
  // "project" returns q, k and v, three views of one storage (each counted with all of it);
  // "query" returns a slice of q beside k and v; "use" drops k and v. From there the slice alone
  // keeps the projection's whole storage alive. The profiler runs "query" on a copy of q, a
  // storage of a third of that: counted so, the slice took steps of timm's coat_lite_tiny up to
  // twice q's size above their prediction.
  const auto project = [](const remat::Tensors& x, const remat::Tensors&) {
    const std::vector<torch::Tensor> qkv = torch::tanh(x[0]).repeat({1, 3}).chunk(3, 1);
    return remat::Tensors{qkv[0], qkv[1], qkv[2]};
  };
  const auto query = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{x[0].narrow(0, 1, 31), x[1], x[2]};
  };
  const auto use = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{x[0] * (x[1] * x[2]).narrow(0, 1, 31)};
  };
  const std::vector<remat::NamedStage> stages{{"project", remat::callable_stage(project)},
                                              {"query", remat::callable_stage(query)},
                                              {"use", remat::callable_stage(use)}};
  const torch::Tensor sample = torch::randn({32, 64}).requires_grad_(true);
  const remat::Chain chain =
      remat::profile(stages, {sample}, {}, quick().measure_time(false)).chain;
  const std::int64_t projection = 3 * 32 * 64 * 4;
  REQUIRE(chain.stages[0].outputs.size() == 3);
  CHECK(chain.stages[0].outputs[0].bytes == projection);
  REQUIRE(chain.stages[1].outputs.size() == 3);
  CHECK(chain.stages[1].outputs[0].bytes == projection);  // not q's 32 * 64 * 4
  CHECK(chain.stages[1].outputs[0].grad_bytes == 31 * 64 * 4);
  CHECK(chain.stages[1].outputs[1].carried_from == 1);
}

TEST_CASE("a member's gradient is counted with the member's elements, not its storage's",
          "[profiler]") {
  // "spread" returns h, a column expanded to h's shape (a stride of 0: 128 bytes of storage,
  // an 8 KiB gradient) and a slice of h (h's whole storage, a gradient of half of it). With the
  // expanded member's gradient counted as its 128 bytes, the step went 8 KiB above its
  // prediction and budget (tests/python/test_random_chains.py, the layout networks).
  const auto spread = [](const remat::Tensors& x, const remat::Tensors&) {
    const torch::Tensor h = torch::tanh(x[0]);
    return remat::Tensors{h, h.mean(1, true).expand({32, 64}), h.narrow(1, 0, 32)};
  };
  const auto read = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{x[0] * x[1] + torch::cat({x[2], x[2]}, 1), x[1]};
  };
  const auto head = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{x[0].sum(1, true) + x[1].sum(1, true)};
  };
  const std::vector<remat::NamedStage> stages{{"spread", remat::callable_stage(spread)},
                                              {"read", remat::callable_stage(read)},
                                              {"head", remat::callable_stage(head)}};
  const torch::Tensor sample = torch::randn({32, 64}).requires_grad_(true);
  const remat::Chain chain =
      remat::profile(stages, {sample}, {}, quick().measure_time(false)).chain;
  const std::int64_t whole = 32 * 64 * 4;
  REQUIRE(chain.stages[0].outputs.size() == 3);
  CHECK(chain.inputs[0].gradient_size() == whole);
  CHECK_FALSE(chain.inputs[0].grad_bytes.has_value());  // the same as its bytes: not written
  const remat::Member& expanded = chain.stages[0].outputs[1];
  CHECK(expanded.bytes == 32 * 4);
  CHECK(expanded.gradient_size() == whole);
  const remat::Member& slice = chain.stages[0].outputs[2];
  CHECK(slice.bytes == whole);
  CHECK(slice.gradient_size() == whole / 2);
  CHECK(chain.gradient_bytes(1) == whole + whole + whole / 2);
  // Carried on, the member brings its gradient's size with it.
  REQUIRE(chain.stages[1].outputs[1].carried_from == 1);
  CHECK(chain.stages[1].outputs[1].gradient_size() == whole);
}

TEST_CASE("context is counted by storage: two views of one mask once, a row with its whole table",
          "[profiler]") {
  // A causal mask and its transpose, given as two context tensors, are one storage; a row of a
  // table keeps the whole table alive. Counted per tensor, the mask would be counted twice and
  // the row as 64 bytes.
  const auto masked = [](const remat::Tensors& x, const remat::Tensors& context) {
    return remat::Tensors{
        torch::tanh(x[0].matmul(context[0]) + x[0].matmul(context[1]) + context[2])};
  };
  const auto head = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{x[0].sum(1, true)};
  };
  const std::vector<remat::NamedStage> stages{
      {"masked", remat::callable_stage(masked, {}, {}, /*takes_context=*/true)},
      {"head", remat::callable_stage(head)}};
  const torch::Tensor mask = torch::ones({16, 16}).tril();
  const torch::Tensor table = torch::randn({8, 16});
  const torch::Tensor sample = torch::randn({4, 16}).requires_grad_(true);
  const remat::Chain chain = remat::profile(stages, {sample}, {mask, mask.t(), table[3]},
                                            quick().measure_time(false))
                                 .chain;
  CHECK(chain.context_bytes ==
        remat::counted_bytes(c10::kCPU, 16 * 16 * 4) + remat::counted_bytes(c10::kCPU, 8 * 16 * 4));
}

TEST_CASE("a tensor returned as two members is two members, in both forwards", "[profiler]") {
  // `return h, h`: the next stage is handed two tensors on h's storage, with autograd and
  // without alike, so the member it passes on (here the second) is the same in both forwards
  // (the forward without autograd, handed h twice, found member 0 in it: "returns a different
  // list of tensors with autograd than without").
  const auto twice = [](const remat::Tensors& x, const remat::Tensors&) {
    const torch::Tensor h = torch::tanh(x[0]);
    return remat::Tensors{h, h};
  };
  const auto main_path = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{torch::sigmoid(x[0]), x[1]};
  };
  const auto add = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{x[0] + x[1]};
  };
  const std::vector<remat::NamedStage> stages{{"twice", remat::callable_stage(twice)},
                                              {"main", remat::callable_stage(main_path)},
                                              {"add", remat::callable_stage(add)}};
  const torch::Tensor sample = torch::randn({32, 64}).requires_grad_(true);
  const remat::Chain chain =
      remat::profile(stages, {sample}, {}, quick().measure_time(false)).chain;
  REQUIRE(chain.stages[1].outputs.size() == 2);
  CHECK_FALSE(chain.stages[1].outputs[0].carried());
  CHECK(chain.stages[1].outputs[1].carried_from == 1);
}

TEST_CASE("a tensor that requires grad must be a parameter of a stage, and context a stage's",
          "[profiler]") {
  const torch::Tensor weight = torch::randn({4, 4}).requires_grad_(true);
  const torch::Tensor sample = torch::randn({2, 4});
  const auto uses_weight = [weight](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{torch::matmul(x[0], weight)};
  };
  const auto tanh = [](const remat::Tensors& x, const remat::Tensors&) {
    return remat::Tensors{torch::tanh(x[0])};
  };
  SECTION("undeclared: refused, naming the stage and the tensor; its gradient left alone") {
    const std::vector<remat::NamedStage> stages{{"first", remat::callable_stage(tanh)},
                                                {"uses", remat::callable_stage(uses_weight)}};
    CHECK_THROWS_WITH(
        remat::profile(stages, {sample}, {}, quick()),
        Catch::Contains("stage 1 (uses) uses a tensor that requires grad (Float [4, 4]) "
                        "that is not a parameter of any stage") &&
            Catch::Contains("list it among a callable stage's parameters (callable_stage(f, "
                            "{tensor}))"));
    CHECK_FALSE(weight.grad().defined());
  }
  SECTION("declared by another stage (a tied weight): measured, its gradient restored") {
    const std::vector<remat::NamedStage> stages{
        {"owner", remat::callable_stage(uses_weight, {weight})},
        {"tied", remat::callable_stage(uses_weight)}};
    const remat::Chain chain = remat::profile(stages, {sample}, {}, quick()).chain;
    CHECK(chain.length() == 2);
    CHECK_FALSE(weight.grad().defined());
  }
  SECTION("context that no stage takes is refused; one taker is enough") {
    const remat::Tensors context{torch::ones({2, 4})};
    std::vector<remat::NamedStage> stages{{"first", remat::callable_stage(tanh)},
                                          {"second", remat::callable_stage(tanh)}};
    CHECK_THROWS_WITH(remat::profile(stages, {sample}, context, quick()),
                      Catch::Contains("1 context tensor(s) given, but no stage takes the context"));
    stages[1].module =
        remat::callable_stage([](const remat::Tensors& x,
                                 const remat::Tensors& c) { return remat::Tensors{x[0] * c[0]}; },
                              {}, {}, true);
    const torch::Tensor input = sample.clone().requires_grad_(true);
    CHECK(remat::profile(stages, {input}, context, quick()).chain.length() == 2);
  }
}

TEST_CASE("bad stages are errors naming the stage, and the model is left unchanged",
          "[profiler]") {
  const torch::Tensor sample = torch::randn({2, 3, 8, 8});
  auto expect_error = [&](nn::Sequential net, const std::string& fragment) {
    const auto state = remat::test::state_of(*net);
    try {
      remat::profile(net, sample, quick());
      FAIL("no error; expected: " << fragment);
    } catch (const remat::ProfileError& error) {
      CHECK_THAT(error.what(), Catch::Contains(fragment));
    }
    CHECK(remat::test::same_tensors(state, remat::test::state_of(*net)));
  };
  SECTION("an input carried twice") {
    expect_error(nn::Sequential(nn::BatchNorm2d(3), Twice()),
                 "stage 1 (1:Twice) returned its input twice");
  }
  SECTION("non-tensor") {
    expect_error(nn::Sequential(nn::BatchNorm2d(3), Count()), "returned long");
  }
  SECTION("in place") {
    expect_error(nn::Sequential(nn::BatchNorm2d(3), InPlace()),
                 "stage 1 (1:InPlace) modified its input in place");
  }
  SECTION("in-place ReLU") {
    expect_error(nn::Sequential(nn::BatchNorm2d(3), nn::ReLU(nn::ReLUOptions(true))),
                 "stage 1 (1:ReLU) modified its input in place");
  }
  SECTION("empty chain") { expect_error(nn::Sequential(), "no stages"); }
  SECTION("a stage's own exception is named, and nested for the caller") {
    nn::Sequential net(nn::BatchNorm2d(3), Throws());
    expect_error(net, "stage 1 (1:Throws): forward failed: the stage's own error");
    try {
      remat::profile(net, sample, quick());
      FAIL("no error from a stage that throws");
    } catch (const remat::ProfileError& error) {
      CHECK_THROWS_AS(std::rethrow_if_nested(error), std::domain_error);
    }
  }
  SECTION("device") {
    nn::Sequential net(nn::BatchNorm2d(3), nn::Conv2d(nn::Conv2dOptions(3, 3, 1)));
    try {
      remat::profile(net, torch::empty({2, 3, 8, 8}, torch::Device(torch::kMeta)), quick());
      FAIL("no error for a sample on another device");
    } catch (const remat::ProfileError& error) {
      CHECK_THAT(error.what(),
                 Catch::Contains("stage 0 (0:BatchNorm2d) has parameters on cpu but the sample is on meta"));
    }
  }
}

TEST_CASE("timing within whole passes: every stage timed, memory as measured alone, the model "
          "restored, and out of memory, each stage alone",
          "[profiler]") {
  torch::manual_seed(3);
  nn::Sequential net = remat::test::conv_chain(8, 10, true);
  const torch::Tensor sample = torch::randn({4, 3, 16, 16});
  const auto state = remat::test::state_of(*net);
  const remat::Profile alone = remat::profile(net, sample, quick().timing(remat::Timing::kStages));
  CHECK(alone.timing == remat::Timing::kStages);
  // On the CPU the automatic choice is each stage alone; with no times, no method.
  CHECK(remat::profile(net, sample, quick()).timing == remat::Timing::kStages);
  CHECK(remat::profile(net, sample, quick().measure_time(false).timing(remat::Timing::kPasses))
            .timing == remat::Timing::kStages);

  torch::manual_seed(77);
  const torch::Tensor expected_random = torch::rand({8});
  torch::manual_seed(77);
  const remat::Profile passes = remat::profile(net, sample, quick().timing(remat::Timing::kPasses));
  CHECK(torch::equal(torch::rand({8}), expected_random));
  CHECK(remat::test::same_tensors(state, remat::test::state_of(*net)));
  for (const auto& p : net->parameters()) CHECK_FALSE(p.grad().defined());
  CHECK(passes.timing == remat::Timing::kPasses);
  REQUIRE(passes.chain.length() == alone.chain.length());
  for (int i = 0; i < passes.chain.length(); ++i) {
    INFO("stage " << i);
    const remat::Stage& s = passes.chain.stages[static_cast<std::size_t>(i)];
    const remat::Stage& a = alone.chain.stages[static_cast<std::size_t>(i)];
    CHECK(s.fwd_ms > 0);
    CHECK(s.bwd_ms > 0);
    REQUIRE(s.fwd_nograd_ms.has_value());
    CHECK(*s.fwd_nograd_ms > 0);
    CHECK(s.out_bytes() == a.out_bytes());
    CHECK(s.state_bytes == a.state_bytes);
    CHECK(s.fwd_tmp_bytes == a.fwd_tmp_bytes);
    CHECK(s.bwd_tmp_bytes == a.bwd_tmp_bytes);
    CHECK(s.saved_inputs == a.saved_inputs);
  }

  // A limit that a stage alone fits in but the passes' store-all does not: each stage alone,
  // every time still measured.
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  nn::Sequential deep;
  for (int k = 0; k < 12; ++k) {
    deep->push_back(nn::Linear(64, 64));
    deep->push_back(nn::Functional(torch::tanh));
  }
  const torch::Tensor rows = torch::randn({1024, 64});
  const remat::Profile unlimited = remat::profile(deep, rows, quick().timing(remat::Timing::kPasses));
  CHECK(unlimited.timing == remat::Timing::kPasses);
  const std::int64_t store_all = remat::store_all_peak(unlimited.chain);
  remat::limit_device_memory(torch::kCPU, tracker.live() + store_all * 3 / 4);
  remat::Profile limited;
  try {
    limited = remat::profile(deep, rows, quick().timing(remat::Timing::kPasses));
  } catch (...) {
    remat::limit_device_memory(torch::kCPU, 0);
    throw;
  }
  remat::limit_device_memory(torch::kCPU, 0);
  CHECK(limited.timing == remat::Timing::kStages);
  for (const remat::Stage& s : limited.chain.stages) {
    CHECK(s.fwd_ms > 0);
    CHECK(s.bwd_ms > 0);
  }
  CHECK(remat::store_all_peak(limited.chain) == store_all);
}

namespace {

// Identity forward, a backward that sleeps 200 ms: a stage whose backward time is known (far
// above what the other stages' take, even on a loaded machine).
struct SlowBackward : torch::autograd::Function<SlowBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return grads;
  }
};

}  // namespace

TEST_CASE("within passes, the restart: the first forward after the backward, less the same one "
          "within the pass",
          "[profiler]") {
  // Stage 0 sleeps 40 ms in its first forward without autograd after a backward reached it:
  // in a pass, that is the forward right after the backward's last engine call, a restart.
  // Measured (on the CPU only when asked), the restart takes the 40 ms, and stage 0's time
  // without autograd is its time within the pass, without them.
  auto backpropagated = std::make_shared<std::atomic<bool>>(false);
  std::vector<remat::NamedStage> stages;
  stages.push_back(
      {"slow after a backward",
       remat::callable_stage([backpropagated](const remat::Tensors& x, const remat::Tensors&) {
         if (!torch::GradMode::is_enabled() && backpropagated->exchange(false))
           std::this_thread::sleep_for(std::chrono::milliseconds(40));
         torch::Tensor out = x[0] * 2;
         if (out.requires_grad())
           out.register_hook([backpropagated](const torch::Tensor&) { *backpropagated = true; });
         return remat::Tensors{out};
       })});
  stages.push_back(
      {"tanh", remat::callable_stage([](const remat::Tensors& x, const remat::Tensors&) {
         return remat::Tensors{torch::tanh(x[0])};
       })});
  const torch::Tensor sample = torch::randn({8, 16}).requires_grad_();
  const auto passes = [&](bool restart) {
    return remat::profile(stages, sample,
                          quick().timing(remat::Timing::kPasses).measure_restart_on_cpu(restart));
  };
  const remat::Profile measured = passes(true);
  REQUIRE(measured.timing == remat::Timing::kPasses);
  CHECK(measured.chain.restart_ms >= 39.9);
  CHECK(measured.chain.restart_ms < 1000);
  CHECK(*measured.chain.stages[0].fwd_nograd_ms < 20);
  CHECK(remat::parse_chain(remat::chain_to_json(measured.chain)).restart_ms ==
        measured.chain.restart_ms);
  // Not asked on the CPU: no restart, and stage 0's first forward after the backward is its
  // time without autograd, the 40 ms included.
  const remat::Profile plain = passes(false);
  CHECK(plain.chain.restart_ms == 0);
  CHECK(*plain.chain.stages[0].fwd_nograd_ms >= 39.9);
}

TEST_CASE("within passes, each stage's backward time is its own, across fused and cut calls",
          "[profiler]") {
  // The passes run consecutive backwards in one engine call, as the runtime does, and cut it
  // where a carried member's gradient is summed (x_2 here: y carried from stage 1). Each
  // stage's backward ends when its inputs' gradients arrive: the slow backward must be
  // stage 2's alone, not its neighbours', on either side of the cut.
  torch::manual_seed(3);
  nn::Linear first(16, 16), last(16, 4);
  std::vector<remat::NamedStage> stages;
  stages.push_back({"linear", nn::AnyModule(first)});
  stages.push_back(
      {"tanh, y carried", remat::callable_stage([](const remat::Tensors& x, const remat::Tensors&) {
         return remat::Tensors{torch::tanh(x[0]), x[0]};
       })});
  stages.push_back(
      {"slow backward", remat::callable_stage([](const remat::Tensors& x, const remat::Tensors&) {
         return remat::Tensors{SlowBackward::apply(x[0]) + x[1]};
       })});
  stages.push_back(
      {"slow again", remat::callable_stage([](const remat::Tensors& x, const remat::Tensors&) {
         return remat::Tensors{SlowBackward::apply(SlowBackward::apply(x[0]))};
       })});
  stages.push_back({"head", nn::AnyModule(last)});
  const remat::Profile passes =
      remat::profile(stages, remat::Tensors{torch::randn({8, 16})}, remat::Tensors{},
                     quick().timing(remat::Timing::kPasses));
  REQUIRE(passes.timing == remat::Timing::kPasses);
  REQUIRE(passes.chain.members(2).size() == 2);
  REQUIRE(passes.chain.members(2)[1].carried());
  const auto bwd = [&](int i) { return passes.chain.stages[static_cast<std::size_t>(i)].bwd_ms; };
  INFO("backward ms: " << bwd(0) << ", " << bwd(1) << ", " << bwd(2) << ", " << bwd(3) << ", "
                       << bwd(4));
  CHECK(bwd(3) >= 400);  // two sleeps
  CHECK(bwd(2) >= 200);
  CHECK(bwd(2) < 400);
  for (const int fast : {0, 1, 4}) {
    CHECK(bwd(fast) > 0);
    CHECK(bwd(fast) < 200);
  }
}

TEST_CASE("on CUDA, times are taken within whole passes by default, memory as each stage alone",
          "[profiler][cuda]") {
  REMAT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(4);
  nn::Sequential net = remat::test::conv_chain(16, 10, true);
  net->to(cuda);
  const torch::Tensor sample = torch::randn({8, 3, 32, 32}).to(cuda);
  const auto state = remat::test::state_of(*net);
  const remat::Profile passes = remat::profile(net, sample, quick());
  CHECK(remat::test::same_tensors(state, remat::test::state_of(*net)));
  const remat::Profile alone = remat::profile(net, sample, quick().timing(remat::Timing::kStages));
  CHECK(passes.timing == remat::Timing::kPasses);
  CHECK(alone.timing == remat::Timing::kStages);
  REQUIRE(passes.chain.length() == alone.chain.length());
  for (std::size_t i = 0; i < passes.chain.stages.size(); ++i) {
    INFO("stage " << i);
    const remat::Stage& s = passes.chain.stages[i];
    CHECK(s.fwd_ms > 0);
    CHECK(s.bwd_ms > 0);
    CHECK(s.fwd_nograd_ms.value_or(0) > 0);
    CHECK(s.state_bytes == alone.chain.stages[i].state_bytes);
    CHECK(s.out_bytes() == alone.chain.stages[i].out_bytes());
  }
}

TEST_CASE("the link to host memory is measured into the chain when asked", "[profiler]") {
  const remat::Link link = remat::measure_link(torch::kCPU, std::int64_t{8} << 20, 3);
  // Memory copies on any machine: more than 0.1 GB/s, a 4 KiB copy in well under a millisecond.
  CHECK(link.d2h_gbps > 0.1);
  CHECK(link.h2d_gbps > 0.1);
  CHECK(link.d2h_gbps <= remat::kMaxLinkGbps);
  CHECK(link.latency_ms >= 0);
  CHECK(link.latency_ms < 1);
  CHECK_NOTHROW(link.validate());
  CHECK_THROWS_AS(remat::measure_link(torch::kCPU, 1024), c10::ValueError);
  CHECK_THROWS_AS(remat::measure_link(torch::kCPU, std::int64_t{8} << 20, 0), c10::ValueError);
  CHECK_THROWS_AS(remat::measure_link(torch::Device(torch::kMeta), std::int64_t{8} << 20),
                  c10::ValueError);
  // The CPU tracker counts none of it: the host side is outside LibTorch's allocator, the
  // device side freed before it returns.
  remat::MemoryTracker& tracker = remat::MemoryTracker::for_device(torch::kCPU);
  const std::int64_t before = tracker.live();
  remat::measure_link(torch::kCPU, std::int64_t{2} << 20, 1);
  CHECK(tracker.live() == before);

  torch::manual_seed(3);
  torch::nn::Sequential net = remat::test::conv_chain(4);
  const torch::Tensor sample = torch::randn({2, 3, 16, 16});
  const remat::Chain plain =
      remat::profile(net, sample, remat::ProfileOptions().measure_time(false)).chain;
  CHECK_FALSE(plain.link.has_value());
  const remat::Chain linked =
      remat::profile(net, sample, remat::ProfileOptions().measure_time(false).repeat(1).measure_link(true))
          .chain;
  REQUIRE(linked.link.has_value());
  CHECK(linked.link->h2d_gbps > 0.1);
  CHECK(remat::parse_chain(remat::chain_to_json(linked), "round trip").link.has_value());
}

namespace {

// A stage of the layout tests: forward calls counted. `proj` makes a view of its linear map's
// output (its backward reshapes the gradient it gets), `turn` transposes (its backward hands
// the stage before a permuted gradient) or, `plain`, does not, `tanh` keeps its output.
struct LayoutStageImpl : nn::Module {
  LayoutStageImpl(std::string what, bool transposes) : kind(std::move(what)), turns(transposes) {
    if (kind == "proj") lin = register_module("lin", nn::Linear(8, 64));
    if (kind == "head") lin = register_module("lin", nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    ++calls;
    if (kind == "proj") return lin->forward(x).view({-1, 8, 8});
    if (kind == "turn") return (turns ? x.transpose(1, 2) : x).narrow(1, 0, 2) * 2.0;
    if (kind == "tanh") return torch::tanh(x);
    return lin->forward(x.reshape({-1, 16}));
  }
  std::string kind;
  bool turns;
  nn::Linear lin{nullptr};
  int calls = 0;
};
TORCH_MODULE(LayoutStage);

}  // namespace

TEST_CASE(
    "a backward is measured from the gradient's layout in a step, again only where it "
    "differs",
    "[profiler]") {
  torch::manual_seed(4);
  const bool transposes = GENERATE(true, false);
  nn::Sequential net;
  std::vector<LayoutStage> stages;
  for (const char* kind : {"proj", "turn", "tanh", "tanh", "head"}) {
    stages.emplace_back(kind, transposes);
    net->push_back(stages.back());
  }
  const remat::Profile p = remat::profile(net, torch::randn({256, 8}), quick().measure_time(false));
  const int head_calls = stages.back()->calls;
  INFO((transposes ? "transposed" : "plain") << "; calls of the last stage: " << head_calls);
  const std::int64_t y1 = p.chain.stages[0].outputs[0].bytes;  // 64 KiB
  if (transposes) {
    // In a step B_proj gets y_1 transposed, and its view's backward copies it.
    CHECK(p.chain.stages[0].bwd_tmp_bytes >= y1);
    CHECK(stages[0]->calls > head_calls);  // measured again
  } else {
    CHECK(p.chain.stages[0].bwd_tmp_bytes < y1 / 2);
    // Every layout plain: no stage runs more than the last, which is never run again.
    for (const LayoutStage& stage : stages) CHECK(stage->calls == head_calls);
  }
}
