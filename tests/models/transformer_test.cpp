// The transformer ports (ViT, GPT-2) without their reference implementations: parameter
// counts, stages at both granularities, checkpointed training exactly equal to plain (on
// CUDA too, with each attention kernel's dropout replayed), input checks. The comparisons with
// torchvision and Hugging Face are in torchvision_test.cpp and gpt2_reference_test.cpp.
#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "models/model_checks.h"
#include "remat/models.h"
#include "remat/runtime.h"
#include "remat/solver.h"
#include "skip.h"

namespace nn = torch::nn;
using namespace remat::models;
using remat::test::reference_state;

namespace {

ViTOptions small_vit() {
  return ViTOptions()
      .image_size(32)
      .patch_size(8)
      .num_layers(3)
      .num_heads(4)
      .hidden_dim(32)
      .mlp_dim(64)
      .num_classes(5)
      .dropout(0.2)
      .attention_dropout(0.1);
}

GPT2Options small_gpt2() {
  return GPT2Options().vocab_size(97).n_positions(24).n_embd(32).n_layer(3).n_head(4);
}

/// Copies `from`'s values into `to`, name by reference name (they must have the same names).
void copy_state(const nn::Sequential& from, nn::Sequential& to) {
  const auto source = reference_state(from);
  auto target = reference_state(to);
  REQUIRE(source.size() == target.size());
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : target) {
    INFO(name);
    REQUIRE(source.count(name) == 1);
    tensor.copy_(source.at(name));
  }
}

}  // namespace

TEST_CASE("the transformers have their references' parameter counts", "[models][transformer]") {
  // torchvision's documented counts (the ViTs are built and counted by the loop below);
  // Hugging Face's GPT2LMHeadModel.num_parameters().
  CHECK(find_model("vit_b_16").known_parameters == 86567656);
  CHECK(find_model("vit_b_32").known_parameters == 88224232);
  CHECK(find_model("vit_l_16").known_parameters == 304326632);
  CHECK(gpt2_parameter_count(gpt2_config("gpt2")) == 124439808);
  CHECK(gpt2_parameter_count(gpt2_config("gpt2-medium")) == 354823168);
  CHECK(gpt2_parameter_count(gpt2_config("gpt2-large")) == 774030080);
  CHECK(gpt2_parameter_count(gpt2_config("gpt2-xl")) == 1557611200);
  // The formula counts what gpt2() builds (the head shares wte: counted once).
  CHECK(parameter_count(*gpt2()) == 124439808);
  CHECK(parameter_count(*gpt2(small_gpt2().n_inner(40))) ==
        gpt2_parameter_count(small_gpt2().n_inner(40)));
  // What `remat models` lists without building them.
  int built = 0;
  for (const auto& info : registry()) {
    INFO(info.name);
    if (info.input == InputKind::kTokens) {
      CHECK(info.known_parameters == gpt2_parameter_count(gpt2_config(info.name)));
      CHECK(info.known_stages == gpt2_config(info.name).n_layer() + 2);
    } else if (info.has_granularity(Granularity::kHalfBlock)) {  // the vision transformers
      const nn::Sequential net = info.make(1000);
      CHECK(parameter_count(*net) == info.known_parameters);
      CHECK(static_cast<int>(net->size()) == info.known_stages);
      ++built;
    }
  }
  CHECK(built == 3);  // the three ViTs
  CHECK_THROWS_WITH(gpt2_config("gpt3"), Catch::Contains("known: gpt2, gpt2-medium"));
}

TEST_CASE("transformer stages at block and half-block granularity", "[models][transformer]") {
  CHECK(vit_b_16()->size() == 1 + 12 + 1);
  CHECK(vit_l_16(ViTOptions().image_size(32))->size() == 1 + 24 + 1);
  CHECK(vision_transformer(small_vit().granularity(Granularity::kHalfBlock))->size() == 1 + 6 + 1);
  CHECK(gpt2(small_gpt2())->size() == 1 + 3 + 1);
  CHECK(gpt2(small_gpt2().granularity(Granularity::kHalfBlock))->size() == 1 + 6 + 1);
  const nn::Sequential half = gpt2(small_gpt2().granularity(Granularity::kHalfBlock));
  CHECK(half->named_children()[1].key() == "h_0_attention");
  CHECK(half->named_children()[2].key() == "h_0_mlp");
  CHECK(parse_granularity("half") == Granularity::kHalfBlock);
  CHECK(parse_granularity("block") == Granularity::kBlock);
  CHECK_THROWS_WITH(parse_granularity("layer"), Catch::Contains("unknown granularity 'layer'"));

  // The same names (the references') at both granularities, so the same weights load; and the
  // same outputs from the same weights.
  torch::manual_seed(0);
  for (bool vit : {true, false}) {
    DYNAMIC_SECTION((vit ? "ViT" : "GPT-2")) {
      nn::Sequential block = vit ? vision_transformer(small_vit()) : gpt2(small_gpt2().loss(false));
      nn::Sequential split = vit ? vision_transformer(small_vit().granularity(Granularity::kHalfBlock))
                                 : gpt2(small_gpt2().loss(false).granularity(Granularity::kHalfBlock));
      std::set<std::string> names_block, names_split;
      for (const auto& [name, t] : reference_state(block)) names_block.insert(name);
      for (const auto& [name, t] : reference_state(split)) names_split.insert(name);
      CHECK(names_block == names_split);
      // Values that tell layers apart (the initialization sets every LayerNorm to 1 and 0).
      {
        torch::NoGradGuard no_grad;
        for (auto& p : block->parameters()) p.normal_(0, 0.2);
      }
      copy_state(block, split);
      block->eval();
      split->eval();
      torch::NoGradGuard no_grad;
      const torch::Tensor x = vit ? torch::randn({2, 3, 32, 32}) : torch::randint(97, {2, 11});
      const auto a = remat::run_stages(remat::stages_of(block), {x});
      const auto b = remat::run_stages(remat::stages_of(split), {x});
      REQUIRE(a.size() == 1);
      REQUIRE(b.size() == 1);
      CHECK(a[0].abs().sum().item<double>() > 0);
      CHECK(torch::equal(a[0], b[0]));
    }
  }
}

TEST_CASE("transformers train checkpointed under a budget exactly as plain",
          "[models][transformer][runtime]") {
  torch::set_num_threads(1);  // the same reduction order in both runs
  struct Case {
    std::string name;
    std::function<nn::Sequential()> make;
    torch::Tensor sample;
  };
  torch::manual_seed(3);
  const std::vector<Case> cases = {
      {"ViT block", [] { return vision_transformer(small_vit()); }, torch::randn({2, 3, 32, 32})},
      {"ViT half", [] { return vision_transformer(small_vit().granularity(Granularity::kHalfBlock)); },
       torch::randn({2, 3, 32, 32})},
      {"GPT-2 block", [] { return gpt2(small_gpt2()); }, torch::randint(97, {2, 16})},
      {"GPT-2 half", [] { return gpt2(small_gpt2().granularity(Granularity::kHalfBlock)); },
       torch::randint(97, {2, 16})},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const bool tokens = c.sample.scalar_type() == torch::kLong;
      const torch::Tensor weight = tokens ? torch::Tensor() : torch::randn({2, 5});
      // One training step: dropout on (it must be replayed), the loss from every output.
      const auto step = [&](nn::Sequential& net, auto forward) {
        torch::manual_seed(5);
        const remat::Tensors out = forward(tokens ? c.sample : c.sample.clone().requires_grad_(true));
        REQUIRE(out.size() == 1);
        torch::Tensor loss = tokens ? out[0] : (out[0] * weight).sum();
        loss.backward();
        std::vector<torch::Tensor> state = {out[0].detach()};
        for (const auto& p : net->parameters()) state.push_back(p.grad());
        return state;
      };
      torch::manual_seed(1);
      nn::Sequential plain_net = c.make();
      {  // A head that is not zero (torchvision zeroes ViT's), so every gradient flows.
        torch::NoGradGuard no_grad;
        for (auto& p : plain_net->parameters()) p.add_(torch::randn_like(p), 0.05);
      }
      plain_net->train();
      const auto plain = step(plain_net, [&](const torch::Tensor& x) {
        return remat::run_stages(remat::stages_of(plain_net), {x});
      });

      nn::Sequential net = c.make();
      copy_state(plain_net, net);
      net->train();
      remat::Checkpointable chk(net);
      const remat::Solution& s = remat::test::schedule_at_half(
          chk, net, tokens ? c.sample : c.sample.clone().requires_grad_(true));
      REQUIRE(s.ok());
      INFO(remat::collapsed_string(s.sequence));
      CHECK(s.makespan_ms > 3.0 * chk->chain().stages.size());  // store-all's: it recomputes
      const auto ours = step(net, [&](const torch::Tensor& x) { return chk->forward(remat::Tensors{x}); });
      REQUIRE(plain.size() == ours.size());
      CHECK(plain.size() == 1 + net->parameters().size());
      for (std::size_t k = 0; k < plain.size(); ++k) {
        INFO("tensor " << k << " of " << plain.size());
        REQUIRE(plain[k].defined());
        CHECK(torch::equal(plain[k], ours[k]));
      }
    }
  }
}

namespace {

// at::Context's switches of the attention kernels, where this LibTorch has them: 1.13 has none,
// 2.0 has no cuDNN kernel (its switch came later). Detected, not read from a version number.
#define REMAT_ATTENTION_SWITCH(name, setter)                                   \
  template <typename Context>                                                  \
  auto name(Context& context, bool on, int) -> decltype(context.setter(on)) { \
    return context.setter(on);                                                 \
  }                                                                            \
  template <typename Context>                                                  \
  void name(Context&, bool, long) {}
REMAT_ATTENTION_SWITCH(use_flash, setSDPUseFlash)
REMAT_ATTENTION_SWITCH(use_mem_efficient, setSDPUseMemEfficient)
REMAT_ATTENTION_SWITCH(use_cudnn, setSDPUseCuDNN)
REMAT_ATTENTION_SWITCH(use_math, setSDPUseMath)
#undef REMAT_ATTENTION_SWITCH

// The fused attention kernels on or off; the math one always on.
void use_fused_attention(bool on) {
  at::Context& context = at::globalContext();
  use_flash(context, on, 0);
  use_mem_efficient(context, on, 0);
  use_cudnn(context, on, 0);
  use_math(context, true, 0);
}

}  // namespace

TEST_CASE("on CUDA, GPT-2 trains checkpointed as plain, attention dropout replayed by every kernel",
          "[models][transformer][runtime][cuda]") {
  REMAT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA, 0);
  // Dropout everywhere (attention included), so that a recomputation that drew other masks
  // would change the gradients by their own size.
  const GPT2Options options =
      small_gpt2().n_embd(64).n_head(2).n_positions(64).resid_pdrop(0.2).embd_pdrop(0.2).attn_pdrop(
          0.2);
  torch::manual_seed(3);
  const torch::Tensor ids = torch::randint(97, {4, 64}).to(cuda);
  struct Backend {
    const char* name;
    bool deterministic;  // bit-identical; else within `tolerance` (atomic adds in the kernel)
    double tolerance;
  };
  // The math kernel under deterministic algorithms: bit-identical. The fused kernels (float32
  // takes the memory-efficient one), whose backward adds atomically: a tolerance far below
  // what one different dropout mask would do.
  for (const Backend& backend : {Backend{"math", true, 0.0}, Backend{"fused", false, 1e-4}}) {
    DYNAMIC_SECTION(backend.name << " attention") {
      use_fused_attention(!backend.deterministic);
      if (backend.deterministic) {
        setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/1);
        at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
      }
      for (const Granularity granularity : {Granularity::kBlock, Granularity::kHalfBlock}) {
        INFO(granularity_name(granularity));
        const auto step = [&](nn::Sequential& net, auto forward) {
          torch::manual_seed(5);
          const remat::Tensors out = forward(ids);
          out[0].backward();
          std::vector<torch::Tensor> state = {out[0].detach()};
          for (const auto& p : net->parameters()) state.push_back(p.grad());
          return state;
        };
        torch::manual_seed(1);
        nn::Sequential plain_net = gpt2(GPT2Options(options).granularity(granularity));
        plain_net->to(cuda);
        plain_net->train();
        const auto plain = step(plain_net, [&](const torch::Tensor& x) {
          return remat::run_stages(remat::stages_of(plain_net), {x});
        });
        torch::manual_seed(1);
        nn::Sequential net = gpt2(GPT2Options(options).granularity(granularity));
        net->to(cuda);
        net->train();
        remat::Checkpointable chk(net);
        const remat::Solution& s = remat::test::schedule_at_half(chk, net, ids);
        REQUIRE(s.ok());
        INFO(remat::collapsed_string(s.sequence));
        CHECK(s.makespan_ms > 3.0 * chk->chain().stages.size());  // store-all's: it recomputes
        const auto ours =
            step(net, [&](const torch::Tensor& x) { return chk->forward(remat::Tensors{x}); });
        REQUIRE(plain.size() == ours.size());
        for (std::size_t k = 0; k < plain.size(); ++k) {
          INFO("tensor " << k << " of " << plain.size());
          REQUIRE(plain[k].defined());
          if (backend.deterministic) {
            CHECK(torch::equal(plain[k], ours[k]));
          } else {
            const double scale = plain[k].abs().max().item<double>();
            CHECK((plain[k] - ours[k]).abs().max().item<double>() <=
                  backend.tolerance * std::max(scale, 1e-6));
          }
        }
      }
      at::globalContext().setDeterministicAlgorithms(false, false);
      use_fused_attention(true);
    }
  }
}

TEST_CASE("GPT-2: the token ids are carried, the head is tied to wte, the loss is the causal LM's",
          "[models][transformer]") {
  torch::manual_seed(0);
  nn::Sequential net = gpt2(small_gpt2().loss(false));
  const torch::Tensor ids = torch::randint(97, {2, 9});
  net->eval();
  torch::NoGradGuard no_grad;
  // The first stage returns the ids themselves (carried: one storage, no copy).
  const auto first = remat::stages_of(net)[0].module->forward({ids}, {});
  REQUIRE(first.size() == 2);
  CHECK(first[1].is_same(ids));
  // wte appears once among the parameters, and the head uses it.
  int wte = 0;
  for (const auto& p : net->named_parameters())
    if (torchvision_name(net, p.key()) == "transformer.wte.weight") ++wte;
  CHECK(wte == 1);
  const auto logits = net->forward<std::vector<torch::Tensor>>(ids);
  REQUIRE(logits.size() == 1);
  CHECK(logits[0].sizes() == torch::IntArrayRef({2, 9, 97}));
  net->named_parameters()["embeddings.wte.weight"].mul_(2);
  CHECK(!torch::equal(net->forward<std::vector<torch::Tensor>>(ids)[0], logits[0]));

  // causal_lm_loss: position t predicts token t + 1; the last position predicts nothing.
  const torch::Tensor l = torch::randn({2, 9, 97});
  torch::Tensor expected = torch::zeros({});
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t + 1 < 9; ++t)
      expected = expected - torch::log_softmax(l[b][t], 0)[ids[b][t + 1].item<int64_t>()];
  CHECK(causal_lm_loss(l, ids).item<double>() == Approx((expected / 16).item<double>()).epsilon(1e-6));
}

TEST_CASE("transformers refuse inputs they cannot take, naming what is wrong", "[models][transformer]") {
  nn::Sequential vit = vision_transformer(small_vit());
  vit->eval();
  torch::NoGradGuard no_grad;
  CHECK_THROWS_WITH(vit->forward(torch::randn({1, 3, 64, 64})),
                    Catch::Contains("expected images of 32x32") && Catch::Contains("got 64x64"));
  CHECK_THROWS_WITH(vision_transformer(ViTOptions().image_size(100)),
                    Catch::Contains("image_size 100 must be a positive multiple of patch_size 16"));
  CHECK_THROWS_WITH(vision_transformer(small_vit().num_heads(5)), Catch::Contains("not a multiple of num_heads"));

  nn::Sequential lm = gpt2(small_gpt2());
  lm->eval();
  const auto run = [&](const torch::Tensor& ids) { return lm->forward<std::vector<torch::Tensor>>(ids); };
  CHECK_THROWS_WITH(run(torch::randint(97, {1, 25})), Catch::Contains("a sequence of 25 tokens; this model takes 1 to 24"));
  CHECK_THROWS_WITH(run(torch::full({1, 4}, 97, torch::kLong)),
                    Catch::Contains("token ids must be in [0, 97); got ids from 97 to 97"));
  CHECK_THROWS_WITH(run(torch::full({1, 4}, -1, torch::kLong)), Catch::Contains("got ids from -1"));
  CHECK_THROWS_WITH(run(torch::zeros({1, 4})), Catch::Contains("integer dtype"));
  CHECK_THROWS_WITH(run(torch::zeros({4}, torch::kLong)), Catch::Contains("(batch, sequence)"));
  CHECK_THROWS_WITH(gpt2(small_gpt2().n_head(5)), Catch::Contains("n_embd 32 is not a multiple of n_head 5"));

  // A file whose lm_head.weight is not wte's (an untied model) is refused; nothing changes.
  nn::Sequential target = gpt2(small_gpt2());
  std::vector<StateDictEntry> entries;
  for (const auto& [name, t] : reference_state(target)) entries.push_back({name, t.clone()});
  const torch::Tensor before = target->named_parameters()["h_0.ln_1.weight"].clone();
  entries.push_back({"lm_head.weight", torch::randn({97, 32})});
  for (auto& e : entries)
    if (e.name == "transformer.h.0.ln_1.weight") e.tensor.fill_(3);
  CHECK_THROWS_WITH(load_gpt2_weights(target, entries, "untied.bin"),
                    Catch::Contains("untied.bin: lm_head.weight differs from transformer.wte.weight"));
  CHECK(torch::equal(target->named_parameters()["h_0.ln_1.weight"], before));
  // With the tied head (or without one), it loads.
  entries.pop_back();
  load_gpt2_weights(target, entries, "tied.bin");
  CHECK(target->named_parameters()["h_0.ln_1.weight"].eq(3).all().item<bool>());
}
