// The torchvision ports: architecture (parameter counts, torchvision's names) and exact
// checkpointed training of every model under an optimal schedule at half its memory.
#include "remat/models.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "models/model_checks.h"
#include "remat/runtime.h"
#include "remat/solver.h"

namespace nn = torch::nn;
using remat::models::parameter_count;

TEST_CASE("the ports have torchvision's parameter counts", "[models]") {
  // torchvision 0.14's figures at 1000 classes (the table).
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"resnet18", 11689512},     {"resnet34", 21797672},     {"resnet50", 25557032},
      {"resnet101", 44549160},    {"resnet152", 60192808},    {"vgg11", 132863336},
      {"vgg11_bn", 132868840},    {"vgg13", 133047848},       {"vgg13_bn", 133053736},
      {"vgg16", 138357544},       {"vgg16_bn", 138365992},    {"vgg19", 143667240},
      {"vgg19_bn", 143678248},    {"densenet121", 7978856},   {"densenet161", 28681000},
      {"densenet169", 14149480},  {"densenet201", 20013928},  {"inception_v3", 27161264},
      {"inception_v3_noaux", 23834568}};
  // torchvision's figures are the registry's, which `remat models` lists without building.
  for (const auto& [name, count] : expected) {
    INFO(name);
    CHECK(remat::models::find_model(name).known_parameters == count);
  }
  // Every model's counts are known, and are the built model's: each image model but the vision
  // transformers is built here (remat's own convnets too); the transformers are built in
  // transformer_test.cpp, and every image model is counted at 10 classes in "every parameter
  // and buffer has a distinct torchvision name".
  for (const auto& info : remat::models::registry()) {
    INFO(info.name);
    CHECK(info.known_parameters > 0);
    CHECK(info.known_stages > 0);
    CHECK(info.parameters_for(1000) == info.known_parameters);
    if (info.has_granularity(remat::models::Granularity::kHalfBlock)) continue;
    const nn::Sequential net = info.make(1000);
    CHECK(parameter_count(*net) == info.known_parameters);
    CHECK(static_cast<int>(net->size()) == info.known_stages);
  }
}

TEST_CASE("stage counts and granularity", "[models]") {
  using namespace remat::models;
  CHECK(resnet18()->size() == 11);   // conv1, maxpool, 8 blocks, fc
  CHECK(resnet50()->size() == 19);   // 16 bottlenecks
  CHECK(resnet152()->size() == 53);  // 50 bottlenecks
  CHECK(vgg16()->size() == 13 + 5 + 4);  // convolutions, pools, avgpool, 3 classifier stages
  CHECK(densenet121()->size() == 1 + 58 + 3 + 1);  // stem, dense layers, transitions, head
  CHECK(inception_v3()->size() == 20);
  CHECK(inception_v3(InceptionV3Options().aux_logits(false))->size() == 19);
  // One stage per branch: 4 in each InceptionA, C and E block, 3 in B and D (Mixed_6a, 7a).
  const auto branches = InceptionV3Options().granularity(Granularity::kBranch);
  CHECK(inception_v3(branches)->size() == 7 + 3 * 4 + 3 + 4 * 4 + 1 + 3 + 2 * 4 + 1);
  CHECK(inception_v3(InceptionV3Options(branches).aux_logits(false))->size() == 50);
  CHECK_THROWS_WITH(inception_v3(InceptionV3Options().granularity(Granularity::kHalfBlock)),
                    Catch::Contains("granularity is block or branch, not half"));
  CHECK_THROWS_WITH(find_model("resnet18").build(ModelConfig{10, 0, Granularity::kBranch}),
                    Catch::Contains("resnet18 has no branch granularity"));
}

TEST_CASE("Inception v3 at branch granularity: one stage per branch, the same network, "
          "trained checkpointed as the block granularity plainly",
          "[models][runtime]") {
  using namespace remat::models;
  const auto stage_names = [](const nn::Sequential& net) {
    std::vector<std::string> names;
    for (const auto& child : net->named_children()) names.push_back(child.key());
    return names;
  };
  for (const bool aux : {true, false}) {
    DYNAMIC_SECTION((aux ? "with" : "without") << " the auxiliary classifier") {
      const auto options = InceptionV3Options().num_classes(7).aux_logits(aux);
      torch::manual_seed(3);
      nn::Sequential block = inception_v3(options);
      torch::manual_seed(3);
      nn::Sequential branch = inception_v3(InceptionV3Options(options).granularity(Granularity::kBranch));
      const auto names = stage_names(branch);
      CHECK(std::vector<std::string>(names.begin() + 6, names.begin() + 11) ==
            std::vector<std::string>{"maxpool2", "Mixed_5b_branch1x1", "Mixed_5b_branch5x5",
                                     "Mixed_5b_branch3x3dbl", "Mixed_5b_branch_pool"});
      // The same parameters and buffers, drawn alike from the same seed, under torchvision's
      // names: the same weights load into both.
      std::map<std::string, torch::Tensor> theirs;
      for (const auto& p : block->named_parameters()) theirs[torchvision_name(block, p.key())] = p.value();
      for (const auto& b : block->named_buffers()) theirs[torchvision_name(block, b.key())] = b.value();
      std::size_t count = 0;
      for (const auto& p : branch->named_parameters()) {
        INFO(p.key());
        const std::string name = torchvision_name(branch, p.key());
        REQUIRE(theirs.count(name) == 1);
        CHECK(torch::equal(theirs[name], p.value()));
        ++count;
      }
      count += branch->named_buffers().size();
      CHECK(count == theirs.size());
      // The block granularity trained plainly, the branch one checkpointed at half its memory:
      // the same outputs, gradients and BatchNorm statistics, bit for bit. The branch stages
      // carry the same tensors, so autograd's graph is the block's; the schedule recomputes
      // some branches, carried members (the auxiliary logits too) included.
      torch::set_num_threads(1);  // the same reduction order in both runs
      const int image = aux ? 299 : 75;
      const torch::Tensor x = torch::randn({2, 3, image, image});
      const auto train = [&](nn::Sequential& net, bool checkpointed) {
        net->train();
        remat::Checkpointable chk(net);
        if (checkpointed) {
          const remat::Solution& s =
              remat::test::schedule_at_half(chk, net, x.clone().requires_grad_(true));
          INFO(remat::collapsed_string(s.sequence));
          CHECK(s.simulation.nograd_forwards > 0);  // it recomputes
        }
        torch::manual_seed(4);  // the head's dropout
        torch::Tensor input = x.clone().requires_grad_(true);
        const remat::Tensors out = checkpointed
                                       ? chk->forward(remat::Tensors{input})
                                       : remat::run_stages(remat::stages_of(net), {input});
        torch::Tensor loss = torch::zeros({});
        for (const torch::Tensor& o : out) loss = loss + o.square().sum();
        loss.backward();
        std::vector<torch::Tensor> state;
        for (const torch::Tensor& o : out) state.push_back(o.detach());
        state.push_back(input.grad());
        for (const auto& p : net->parameters()) state.push_back(p.grad());
        for (const auto& b : net->buffers()) state.push_back(b.clone());
        return state;
      };
      const auto a = train(block, false), b = train(branch, true);
      REQUIRE(a.size() == b.size());
      CHECK(a.size() == (aux ? 2u : 1u) + 1 + block->parameters().size() + block->buffers().size());
      for (std::size_t k = 0; k < a.size(); ++k) {
        INFO("tensor " << k);
        CHECK(torch::equal(a[k], b[k]));
      }
    }
  }
}

TEST_CASE("Inception v3's branch stages carry the block's input and finished branches",
          "[models][profiler]") {
  using namespace remat::models;
  nn::Sequential net = inception_v3(
      InceptionV3Options().num_classes(7).aux_logits(false).granularity(Granularity::kBranch));
  const remat::Chain chain =
      remat::profile(net, torch::randn({2, 3, 75, 75}), remat::ProfileOptions().measure_time(false))
          .chain;
  const auto find = [&](const std::string& name) -> const remat::Stage& {
    for (const remat::Stage& s : chain.stages)
      if (s.name == name) return s;
    FAIL("no stage " << name);
    return chain.stages.front();
  };
  // {x, b1} -> {x, b1, b5x5}: x and the first branch carried (one storage each), one new member.
  const remat::Stage& second = find("Mixed_5b_branch5x5");
  REQUIRE(second.outputs.size() == 3);
  CHECK(second.outputs[0].carried_from == 0);
  CHECK(second.outputs[1].carried_from == 1);
  CHECK_FALSE(second.outputs[2].carried());
  CHECK(second.outputs[2].bytes == 2 * 64 * 7 * 7 * 4);  // 75x75 makes Mixed_5b's maps 7x7
  // The block's last stage: {x, b1, b5x5, b3x3dbl} -> {the four concatenated}, new.
  const remat::Stage& last = find("Mixed_5b_branch_pool");
  REQUIRE(last.outputs.size() == 1);
  CHECK_FALSE(last.outputs[0].carried());
  CHECK(last.outputs[0].bytes == 2 * 256 * 7 * 7 * 4);
}

TEST_CASE("options: zero_init_residual, DenseNet's free configuration", "[models]") {
  using namespace remat::models;
  nn::Sequential plain = resnet50(), zeroed = resnet50(ResNetOptions().zero_init_residual(true));
  CHECK(zeroed->named_parameters()["layer1_0.bn3.weight"].abs().sum().item<double>() == 0);
  CHECK(zeroed->named_parameters()["layer4_2.bn3.weight"].abs().sum().item<double>() == 0);
  CHECK(plain->named_parameters()["layer1_0.bn3.weight"].eq(1).all().item<bool>());
  CHECK(zeroed->named_parameters()["layer1_0.bn2.weight"].eq(1).all().item<bool>());
  CHECK(resnet18(ResNetOptions().zero_init_residual(true))
            ->named_parameters()["layer2_1.bn2.weight"].abs().sum().item<double>() == 0);
  // A small DenseNet: 2 blocks of 3 and 2 layers, growth 8, 16 initial features.
  nn::Sequential dense = densenet(
      DenseNetOptions().num_classes(5).growth_rate(8).block_config({3, 2}).num_init_features(16).bn_size(2));
  CHECK(dense->size() == 1 + 3 + 1 + 2 + 1);
  torch::NoGradGuard no_grad;
  dense->eval();
  // 16 + 3 * 8 = 40 channels, halved by the transition to 20, + 2 * 8 = 36 into the head.
  CHECK(dense->named_parameters()["classifier.classifier.weight"].sizes() == torch::IntArrayRef({5, 36}));
  CHECK(dense->forward(torch::randn({1, 3, 32, 32})).sizes() == torch::IntArrayRef({1, 5}));
  CHECK_THROWS_WITH(densenet(DenseNetOptions().block_config({})), Catch::Contains("block_config"));
  CHECK_THROWS_WITH(resnet18(ResNetOptions().num_classes(0)), Catch::Contains("num_classes"));
}

TEST_CASE("dropout inside stages (DenseNet's drop_rate) recomputes the same masks", "[models][runtime]") {
  using namespace remat::models;
  torch::set_num_threads(1);
  const auto make = [] {
    torch::manual_seed(2);
    return densenet(DenseNetOptions().num_classes(4).growth_rate(8).block_config({4, 3})
                        .num_init_features(16).bn_size(2).drop_rate(0.3));
  };
  const torch::Tensor x = torch::randn({2, 3, 32, 32});
  nn::Sequential plain = make();
  torch::manual_seed(9);
  torch::Tensor plain_out = plain->forward(x);
  plain_out.pow(2).sum().backward();
  nn::Sequential net = make();
  remat::Checkpointable chk(net);
  remat::Chain chain = remat::profile(net, x, remat::ProfileOptions().measure_time(false)).chain;
  for (auto& stage : chain.stages) stage.fwd_ms = 1, stage.bwd_ms = 2;
  chk->set_chain(chain);
  const remat::Solution& s =
      chk->compute_sequence(remat::min_feasible_budget(chain, remat::SolveOptions(0)) + remat::runtime_reserve_bytes(torch::kCPU));
  INFO(remat::collapsed_string(s.sequence));
  torch::manual_seed(9);
  torch::Tensor out = chk->forward(x);
  out.pow(2).sum().backward();
  CHECK(torch::equal(out, plain_out));
  const auto a = plain->parameters(), b = net->parameters();
  for (std::size_t k = 0; k < a.size(); ++k) CHECK(torch::equal(a[k].grad(), b[k].grad()));
}

TEST_CASE("every parameter and buffer has a distinct torchvision name", "[models]") {
  using namespace remat::models;
  nn::Sequential net = resnet18();
  CHECK(torchvision_name(net, "conv1.conv1.weight") == "conv1.weight");
  CHECK(torchvision_name(net, "layer2_0.downsample.0.weight") == "layer2.0.downsample.0.weight");
  CHECK(torchvision_name(net, "fc.fc.bias") == "fc.bias");
  nn::Sequential dense = densenet121();
  CHECK(torchvision_name(dense, "classifier.norm5.running_var") == "features.norm5.running_var");
  CHECK(torchvision_name(dense, "block2_layer3.conv1.weight") ==
        "features.denseblock2.denselayer3.conv1.weight");
  for (const auto& info : registry()) {
    INFO(info.name);
    // GPT-2's names are GPT2LMHeadModel's (gpt2_reference_test.cpp); the larger ones are not
    // built here (gpt2-xl takes 6 GB).
    if (info.input == InputKind::kTokens) continue;
    nn::Sequential model = info.make(10);
    // `remat models --classes 10` lists this count without building the model.
    CHECK(parameter_count(*model) == info.parameters_for(10));
    std::set<std::string> names;
    std::size_t count = 0;
    for (const auto& p : model->named_parameters()) names.insert(torchvision_name(model, p.key())), ++count;
    for (const auto& b : model->named_buffers()) names.insert(torchvision_name(model, b.key())), ++count;
    CHECK(names.size() == count);
  }
}

TEST_CASE("Inception's auxiliary logits are a side output carried through the chain", "[models]") {
  using namespace remat::models;
  torch::manual_seed(0);
  nn::Sequential net = inception_v3(InceptionV3Options().num_classes(7));
  net->train();
  const torch::Tensor x = torch::randn({2, 3, 299, 299});
  // The Sequential runs (its stages after AuxLogits take their members as one list) and returns
  // {logits, aux_logits}.
  torch::manual_seed(1);
  const auto out = net->forward<std::vector<torch::Tensor>>(x);
  REQUIRE(out.size() == 2);
  CHECK(out[0].sizes() == torch::IntArrayRef({2, 7}));
  CHECK(out[1].sizes() == torch::IntArrayRef({2, 7}));
  // Both heads get gradients from a loss on both outputs.
  (out[0].sum() + 0.4 * out[1].sum()).backward();
  for (const auto& p : net->named_parameters()) {
    INFO(p.key());
    CHECK(p.value().grad().defined());
  }
  // As stages: the auxiliary logits leave AuxLogits and reach the output as the same tensor
  // (carried: one storage, no copy), and the results are the Sequential's.
  {
    torch::NoGradGuard no_grad;
    const std::vector<remat::NamedStage> stages = remat::stages_of(net);
    REQUIRE(stages[15].name == "AuxLogits");
    REQUIRE(stages[16].module->type_name() == "CarriesAux<InceptionD>");
    torch::manual_seed(1);
    remat::Tensors members = {x};
    torch::Tensor aux;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      members = stages[i].module->forward(members, {});
      REQUIRE(members.size() == (i < 15 ? 1U : 2U));
      if (i == 15) aux = members[1];
      if (i > 15) CHECK(members[1].is_same(aux));
    }
    CHECK(torch::equal(members[0], out[0]));
    CHECK(torch::equal(members[1], out[1]));
  }
  net->eval();
  torch::NoGradGuard no_grad;
  const auto eval_out = net->forward<std::vector<torch::Tensor>>(x.narrow(0, 0, 1));
  REQUIRE(eval_out.size() == 1);
  CHECK(eval_out[0].sizes() == torch::IntArrayRef({1, 7}));
  // The auxiliary head refuses inputs that are too small, naming the way out.
  net->train();
  CHECK_THROWS_WITH(net->forward<std::vector<torch::Tensor>>(torch::randn({2, 3, 75, 75})),
                    Catch::Contains("aux_logits(false)"));
  // Without it, a tensor in, a tensor out, from 75x75.
  nn::Sequential noaux = inception_v3(InceptionV3Options().num_classes(7).aux_logits(false));
  CHECK(noaux->forward(torch::randn({2, 3, 75, 75})).sizes() == torch::IntArrayRef({2, 7}));
}

TEST_CASE("load_torchvision_weights checks names and shapes before changing anything", "[models]") {
  using namespace remat::models;
  nn::Sequential net = resnet18(ResNetOptions().num_classes(10));
  std::vector<StateDictEntry> state;
  for (const auto& p : net->named_parameters())
    state.push_back({torchvision_name(net, p.key()), torch::full_like(p.value(), 0.5)});
  for (const auto& b : net->named_buffers())
    state.push_back({torchvision_name(net, b.key()), b.value().clone()});
  const torch::Tensor before = net->named_parameters()["fc.fc.weight"].clone();

  SECTION("a full state dict loads") {
    load_torchvision_weights(net, state);
    CHECK(net->named_parameters()["fc.fc.weight"].eq(0.5).all().item<bool>());
  }
  SECTION("DataParallel's 'module.' prefix and a missing num_batches_tracked are accepted") {
    std::vector<StateDictEntry> parallel;
    for (const auto& e : state)
      if (e.name.find("num_batches_tracked") == std::string::npos)
        parallel.push_back({"module." + e.name, e.tensor});
    net->named_buffers()["conv1.bn1.num_batches_tracked"].fill_(7);
    load_torchvision_weights(net, parallel);
    CHECK(net->named_parameters()["layer1_0.conv1.weight"].eq(0.5).all().item<bool>());
    CHECK(net->named_buffers()["conv1.bn1.num_batches_tracked"].item<int64_t>() == 0);
  }
  SECTION("missing, unexpected and mis-shaped names are all listed, nothing is loaded") {
    std::vector<StateDictEntry> bad = state;
    bad.erase(bad.begin());                                       // conv1.weight missing
    bad.push_back({"fc.extra", torch::zeros({1})});                // unexpected
    for (auto& e : bad)
      if (e.name == "fc.weight") e.tensor = torch::zeros({1000, 512});  // wrong shape
    try {
      load_torchvision_weights(net, bad, "bad.pth");
      FAIL("no error");
    } catch (const WeightsError& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("bad.pth") && Catch::Contains("missing (1): conv1.weight") &&
                           Catch::Contains("unexpected (1): fc.extra") &&
                           Catch::Contains("fc.weight (file [1000, 512], model [10, 512])"));
    }
    CHECK(torch::equal(net->named_parameters()["fc.fc.weight"], before));
  }
}

// Every model of a family (its name starts with `family`: all but the convnets, covered by the
// runtime tests, and the transformers, at small sizes and both granularities in
// transformer_test.cpp) trains checkpointed at half its memory exactly as plain. Inception v3 by
// branch, checkpointed: "Inception v3 at branch granularity" below. One test case per family, so
// that ctest runs them side by side. The VGGs' classifiers are 64 wide, not 4096 (the same
// layers; at full width, with their 100 million weights, the test took 50 s here, 10 s so).
namespace {
void check_family_trains_as_plain(const std::string& family) {
  torch::set_num_threads(1);  // the same reduction order in both runs
  int models = 0;
  for (const auto& info : remat::models::registry()) {
    if (info.name.rfind(family, 0) != 0) continue;
    ++models;
    DYNAMIC_SECTION(info.name) {
      const remat::models::ModelConfig config{10, 0, remat::models::Granularity::kBlock};
      const int image = std::max(info.min_image, 64);
      const torch::Tensor sample = torch::randn({2, 3, image, image});
      const torch::Tensor target = torch::randn({2, 10});
      const auto step = [&](nn::Sequential& net, auto forward) {
        torch::manual_seed(5);
        torch::Tensor x = sample.clone().requires_grad_(true);
        const remat::Tensors out = forward(x);
        // Every output member in the loss: Inception's auxiliary logits too.
        torch::Tensor loss = torch::zeros({});
        for (const torch::Tensor& o : out) loss = loss + (o * target).sum();
        loss.backward();
        std::vector<torch::Tensor> state = {x.grad()};
        for (const torch::Tensor& o : out) state.push_back(o.detach());
        for (const auto& p : net->parameters()) state.push_back(p.grad());
        for (const auto& b : net->buffers()) state.push_back(b.clone());
        return state;
      };
      const auto build = [&] {
        if (family == "vgg")
          return remat::test::vgg_named(
              info.name, remat::models::VGGOptions().num_classes(10).classifier_width(64));
        return info.build(config);
      };
      torch::manual_seed(1);
      nn::Sequential plain_net = build();
      const auto plain = step(plain_net, [&](const torch::Tensor& x) {
        return remat::run_stages(remat::stages_of(plain_net), {x});
      });
      CHECK(plain.size() == 2 + (info.name == "inception_v3") + plain_net->parameters().size() +
                                plain_net->buffers().size());

      torch::manual_seed(1);
      nn::Sequential net = build();
      remat::Checkpointable chk(net);
      // Measured with an input that wants its gradient, as step() trains.
      const remat::Solution& s =
          remat::test::schedule_at_half(chk, net, sample.clone().requires_grad_(true));
      INFO(remat::collapsed_string(s.sequence));
      CHECK(s.makespan_ms > 3.0 * chk->chain().stages.size());  // store-all's: it recomputes
      const auto ours =
          step(net, [&](const torch::Tensor& x) { return chk->forward(remat::Tensors{x}); });
      REQUIRE(plain.size() == ours.size());
      for (std::size_t k = 0; k < plain.size(); ++k) {
        INFO("tensor " << k << " of " << plain.size());
        REQUIRE(plain[k].defined());
        CHECK(torch::equal(plain[k], ours[k]));
      }
    }
  }
  REQUIRE(models > 0);
}
}  // namespace

TEST_CASE("every ResNet trains checkpointed at half its memory exactly as plain", "[models][runtime]") {
  check_family_trains_as_plain("resnet");
}

TEST_CASE("every VGG trains checkpointed at half its memory exactly as plain", "[models][runtime]") {
  check_family_trains_as_plain("vgg");
}

TEST_CASE("every DenseNet and Inception v3 trains checkpointed at half its memory exactly as plain",
          "[models][runtime]") {
  check_family_trains_as_plain("densenet");
  check_family_trains_as_plain("inception");
}

TEST_CASE("the families above are every model but the convnets and the transformers", "[models]") {
  for (const auto& info : remat::models::registry()) {
    INFO(info.name);
    const bool convnet = info.name.rfind("convnet", 0) == 0;
    const bool transformer = info.has_granularity(remat::models::Granularity::kHalfBlock);
    const bool family = info.name.rfind("resnet", 0) == 0 || info.name.rfind("vgg", 0) == 0 ||
                        info.name.rfind("densenet", 0) == 0 || info.name.rfind("inception", 0) == 0;
    CHECK(convnet + transformer + family == 1);
  }
}

TEST_CASE("classification_loss: cross-entropy, and Inception's auxiliary term as torchvision", "[models]") {
  namespace F = torch::nn::functional;
  torch::manual_seed(5);
  const torch::Tensor logits = torch::randn({4, 7}), aux = torch::randn({4, 7});
  const torch::Tensor target = torch::randint(7, {4}, torch::kLong);
  CHECK(torch::equal(remat::models::classification_loss({logits}, target),
                     F::cross_entropy(logits, target)));
  CHECK(torch::equal(remat::models::classification_loss({logits, aux}, target),
                     F::cross_entropy(logits, target) + 0.4 * F::cross_entropy(aux, target)));
  CHECK_THROWS_WITH(remat::models::classification_loss({logits, aux, aux}, target),
                    Catch::Contains("got 3 tensors"));
}
