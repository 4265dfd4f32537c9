// The GPT-2 port against Hugging Face transformers' GPT2LMHeadModel: its weights, saved by
// transformers as model.safetensors, as torch.save's pytorch_model.bin and in the published
// "gpt2" files' form (GPT2Model's names, the causal-mask buffers), load into the port, which
// then reproduces the logits, the loss and a training step's gradients
// (tests/models/make_transformers_reference.py writes them before these tests).
#include <catch2/catch.hpp>
#include <map>

#include "models/model_checks.h"
#include "test_paths.h"
#include "remat/models.h"

namespace nn = torch::nn;
using namespace remat::models;
using remat::test::relative_error;

namespace {

std::string reference(const std::string& file) {
  return std::string(remat::test_paths::transformers_reference_dir) + "/" + file;
}

GPT2Options small() {
  return GPT2Options().vocab_size(101).n_positions(32).n_embd(64).n_layer(2).n_head(4)
      .resid_pdrop(0).embd_pdrop(0).attn_pdrop(0);
}

}  // namespace

TEST_CASE("GPT-2 reproduces Hugging Face's logits, loss and gradients from each of its files",
          "[models][gpt2][transformers]") {
  const auto io = remat::test::read_tensors(reference("gpt2_small_io.pth"));
  for (const char* file : {"gpt2_small.safetensors", "gpt2_small.bin", "gpt2_small_base.bin"}) {
    for (Granularity granularity : {Granularity::kBlock, Granularity::kHalfBlock}) {
      DYNAMIC_SECTION(file << " " << granularity_name(granularity)) {
        // Eval mode: the logits (loss off) and the loss.
        nn::Sequential logits_net = gpt2(small().loss(false).granularity(granularity));
        load_gpt2_weights(logits_net, reference(file));
        logits_net->eval();
        {
          torch::NoGradGuard no_grad;
          const auto logits = logits_net->forward<std::vector<torch::Tensor>>(io.at("ids"));
          REQUIRE(logits.size() == 1);
          INFO("logits relative error " << relative_error(logits[0], io.at("logits")));
          CHECK(relative_error(logits[0], io.at("logits")) < 1e-5);
        }
        nn::Sequential net = gpt2(small().granularity(granularity));
        load_gpt2_weights(net, reference(file));
        net->eval();
        {
          torch::NoGradGuard no_grad;
          const auto loss = net->forward<std::vector<torch::Tensor>>(io.at("ids"));
          REQUIRE(loss.size() == 1);
          CHECK(loss[0].item<double>() == Approx(io.at("loss").item<double>()).epsilon(1e-6));
        }
        // A training step: the loss and the gradients of wte (the embedding and the tied head
        // both contribute) and of the first block's c_fc.
        net->train();
        const auto loss = net->forward<std::vector<torch::Tensor>>(io.at("ids"));
        loss[0].backward();
        CHECK(loss[0].item<double>() == Approx(io.at("train_loss").item<double>()).epsilon(1e-6));
        const auto params = net->named_parameters();
        const std::string c_fc = granularity == Granularity::kBlock ? "h_0.mlp.c_fc.weight" : "h_0_mlp.mlp.c_fc.weight";
        CHECK(relative_error(params["embeddings.wte.weight"].grad(), io.at("wte_grad")) < 1e-5);
        CHECK(relative_error(params[c_fc].grad(), io.at("c_fc_grad")) < 1e-5);
      }
    }
  }
}

TEST_CASE("GPT-2's names and shapes are GPT2LMHeadModel's", "[models][gpt2][transformers]") {
  // Every tensor of the 124M configuration, as transformers lists its state dict.
  auto expected = remat::test::read_shape_listing(reference("gpt2_names.txt"))["gpt2"];
  REQUIRE(expected.size() > 100);
  REQUIRE(expected.count("lm_head.weight") == 1);
  expected.erase("lm_head.weight");  // tied: wte's
  CHECK(remat::test::reference_shapes(gpt2()) == expected);
}
