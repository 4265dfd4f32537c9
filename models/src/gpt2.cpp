// Hugging Face's GPT2LMHeadModel as a chain: the embeddings, one stage per block (or two,
// Granularity::kHalfBlock), and the LM head with the loss. Every activation is {hidden states,
// token ids}; the ids are carried (remat/core/stage.h) so that the head finds its labels.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "layers.h"
#include "remat/core/stage.h"
#include "remat/models/safetensors.h"
#include "remat/models/transformer.h"
#include "remat/models/weights.h"

namespace remat::models {
namespace {

namespace nn = torch::nn;
using torch::Tensor;

/// Hugging Face's Conv1D: a linear layer whose weight is stored (in, out): x W + b.
class Conv1DImpl : public nn::Module {
 public:
  Conv1DImpl(int64_t in, int64_t out, double std)
      : weight(register_parameter("weight", torch::empty({in, out}).normal_(0, std))),
        bias(register_parameter("bias", torch::zeros({out}))) {}
  Tensor forward(const Tensor& x) {
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(1);
    return torch::addmm(bias, x.reshape({-1, x.size(-1)}), weight).view(sizes);
  }
  Tensor weight, bias;
};
TORCH_MODULE(Conv1D);

/// Checks the members a GPT-2 stage gets: {hidden states, token ids}.
void check_members(const std::vector<Tensor>& members, const char* stage) {
  TORCH_CHECK_VALUE(members.size() == 2, "GPT-2: stage ", stage,
                    " takes {hidden states, token ids}; got ", members.size(), " tensors");
}

/// wte(ids) + wpe(positions), dropout: ids -> {hidden states, ids}.
class EmbeddingsImpl : public nn::Module {
 public:
  explicit EmbeddingsImpl(const GPT2Options& o)
      : vocab_(o.vocab_size()),
        positions_(o.n_positions()),
        wte(register_module("wte", nn::Embedding(o.vocab_size(), o.n_embd()))),
        wpe(register_module("wpe", nn::Embedding(o.n_positions(), o.n_embd()))),
        drop_(register_module("drop", nn::Dropout(o.embd_pdrop()))) {
    nn::init::normal_(wte->weight, 0, 0.02);
    nn::init::normal_(wpe->weight, 0, 0.02);
  }

  std::vector<Tensor> forward(const Tensor& ids) {
    TORCH_CHECK_VALUE(ids.dim() == 2 && !ids.is_floating_point() && !ids.is_complex() &&
                          ids.scalar_type() != torch::kBool,
                      "GPT-2: expected token ids of shape (batch, sequence) and an integer dtype, "
                      "got ",
                      ids.sizes(), " ", ids.scalar_type());
    TORCH_CHECK_VALUE(ids.size(1) >= 1 && ids.size(1) <= positions_, "GPT-2: a sequence of ",
                      ids.size(1), " tokens; this model takes 1 to ", positions_);
    if (ids.numel() > 0) {
      // Embedding would fail with an index error naming nothing: say what is wrong.
      const auto range = torch::aminmax(ids);
      const int64_t low = std::get<0>(range).item<int64_t>(), high = std::get<1>(range).item<int64_t>();
      TORCH_CHECK_VALUE(low >= 0 && high < vocab_, "GPT-2: token ids must be in [0, ", vocab_,
                        "); got ids from ", low, " to ", high);
    }
    const Tensor positions = torch::arange(ids.size(1), ids.options().dtype(torch::kLong));
    return {drop_(wte(ids) + wpe(positions)), ids};
  }

 private:
  int64_t vocab_, positions_;

 public:
  nn::Embedding wte, wpe;

 private:
  nn::Dropout drop_;
};
TORCH_MODULE(Embeddings);

/// GPT2Attention: c_attn (q, k, v), causal attention, c_proj, resid_dropout.
class AttentionImpl : public nn::Module {
 public:
  explicit AttentionImpl(const GPT2Options& o)
      : embd_(o.n_embd()),
        heads_(o.n_head()),
        attn_pdrop_(o.attn_pdrop()),
        c_attn_(register_module("c_attn", Conv1D(o.n_embd(), 3 * o.n_embd(), 0.02))),
        c_proj_(register_module(
            "c_proj", Conv1D(o.n_embd(), o.n_embd(), 0.02 / std::sqrt(2.0 * double(o.n_layer()))))),
        resid_dropout_(register_module("resid_dropout", nn::Dropout(o.resid_pdrop()))) {}

  Tensor forward(const Tensor& x) {
    const int64_t n = x.size(0), len = x.size(1), head = embd_ / heads_;
    const auto qkv = c_attn_(x).split(embd_, 2);
    const auto split = [&](const Tensor& t) { return t.view({n, len, heads_, head}).transpose(1, 2); };
    const Tensor out = detail::attention(split(qkv[0]), split(qkv[1]), split(qkv[2]),
                                         /*causal=*/len > 1, is_training() ? attn_pdrop_ : 0.0);
    return resid_dropout_(c_proj_(out.transpose(1, 2).contiguous().view({n, len, embd_})));
  }

 private:
  int64_t embd_, heads_;
  double attn_pdrop_;
  Conv1D c_attn_, c_proj_;
  nn::Dropout resid_dropout_;
};
TORCH_MODULE(Attention);

/// GPT2MLP: c_fc, gelu_new (GELU's tanh approximation), c_proj, dropout.
class MLPImpl : public nn::Module {
 public:
  MLPImpl(const GPT2Options& o, int64_t inner)
      : c_fc_(register_module("c_fc", Conv1D(o.n_embd(), inner, 0.02))),
        c_proj_(register_module(
            "c_proj", Conv1D(inner, o.n_embd(), 0.02 / std::sqrt(2.0 * double(o.n_layer()))))),
        dropout_(register_module("dropout", nn::Dropout(o.resid_pdrop()))) {}
  Tensor forward(const Tensor& x) { return dropout_(c_proj_(torch::gelu(c_fc_(x), "tanh"))); }

 private:
  Conv1D c_fc_, c_proj_;
  nn::Dropout dropout_;
};
TORCH_MODULE(MLP);

/// GPT2Block, or one of its halves: x + attn(ln_1(x)), then x + mlp(ln_2(x)); the token ids
/// carried.
class GPT2BlockImpl : public nn::Module, public MemberListModule {
 public:
  GPT2BlockImpl(const GPT2Options& o, bool attention_half, bool mlp_half) {
    const auto norm = [&] {
      return nn::LayerNorm(nn::LayerNormOptions({o.n_embd()}).eps(o.layer_norm_epsilon()));
    };
    if (attention_half) {
      ln_1_ = register_module("ln_1", norm());
      attn_ = register_module("attn", Attention(o));
    }
    if (mlp_half) {
      ln_2_ = register_module("ln_2", norm());
      mlp_ = register_module("mlp", MLP(o, o.n_inner() > 0 ? o.n_inner() : 4 * o.n_embd()));
    }
  }

  std::vector<Tensor> forward(std::vector<Tensor> members) {
    check_members(members, "h");
    Tensor& x = members[0];
    if (attn_) x = attn_(ln_1_(x)) + x;
    if (mlp_) x = x + mlp_(ln_2_(x));
    return members;
  }

 private:
  nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  Attention attn_{nullptr};
  MLP mlp_{nullptr};
};
TORCH_MODULE(GPT2Block);

/// transformer.ln_f, the head (wte's weight: GPT-2 ties them; held here, registered by the
/// embeddings stage alone so that the chain lists it once), and the loss against the ids.
class LMHeadImpl : public nn::Module, public MemberListModule {
 public:
  LMHeadImpl(const GPT2Options& o, nn::Embedding wte)
      : loss_(o.loss()),
        ln_f_(register_module(
            "ln_f", nn::LayerNorm(nn::LayerNormOptions({o.n_embd()}).eps(o.layer_norm_epsilon())))),
        wte_(std::move(wte)) {}

  std::vector<Tensor> forward(std::vector<Tensor> members) {
    check_members(members, "lm_head");
    const Tensor logits = torch::linear(ln_f_(members[0]), wte_->weight);
    if (!loss_) return {logits};
    return {causal_lm_loss(logits, members[1])};
  }

 private:
  bool loss_;
  nn::LayerNorm ln_f_;
  nn::Embedding wte_;  // not registered
};
TORCH_MODULE(LMHead);

}  // namespace

Tensor causal_lm_loss(const Tensor& logits, const Tensor& ids) {
  TORCH_CHECK_VALUE(logits.dim() == 3 && ids.dim() == 2 && logits.size(0) == ids.size(0) &&
                        logits.size(1) == ids.size(1),
                    "causal_lm_loss: expected logits (batch, sequence, vocabulary) and ids (batch, "
                    "sequence), got ",
                    logits.sizes(), " and ", ids.sizes());
  // Hugging Face's ForCausalLMLoss: the labels shifted left, the last position ignored (-100),
  // the mean over the others, in float32.
  const Tensor labels = torch::constant_pad_nd(ids.slice(1, 1).to(torch::kLong), {0, 1}, -100);
  namespace F = torch::nn::functional;
  return F::cross_entropy(logits.to(torch::kFloat).reshape({-1, logits.size(2)}),
                          labels.reshape({-1}), F::CrossEntropyFuncOptions().ignore_index(-100));
}

GPT2Options gpt2_config(const std::string& name, GPT2Options o) {
  if (name == "gpt2") return o.n_layer(12).n_embd(768).n_head(12);
  if (name == "gpt2-medium") return o.n_layer(24).n_embd(1024).n_head(16);
  if (name == "gpt2-large") return o.n_layer(36).n_embd(1280).n_head(20);
  if (name == "gpt2-xl") return o.n_layer(48).n_embd(1600).n_head(25);
  TORCH_CHECK_VALUE(false, "unknown GPT-2 configuration '", name,
                    "' (known: gpt2, gpt2-medium, gpt2-large, gpt2-xl)");
}

std::int64_t gpt2_parameter_count(const GPT2Options& o) {
  const int64_t e = o.n_embd(), inner = o.n_inner() > 0 ? o.n_inner() : 4 * e;
  const int64_t block = 2 * e                   // ln_1
                        + e * 3 * e + 3 * e     // c_attn
                        + e * e + e             // attn.c_proj
                        + 2 * e                 // ln_2
                        + e * inner + inner     // c_fc
                        + inner * e + e;        // mlp.c_proj
  return o.vocab_size() * e + o.n_positions() * e + o.n_layer() * block + 2 * e;
}

torch::nn::Sequential gpt2(const GPT2Options& o) {
  TORCH_CHECK_VALUE(o.vocab_size() >= 1 && o.n_positions() >= 1 && o.n_embd() >= 1 &&
                        o.n_layer() >= 1 && o.n_head() >= 1 && o.n_inner() >= 0,
                    "GPT-2: vocab_size, n_positions, n_embd, n_layer and n_head must be >= 1");
  TORCH_CHECK_VALUE(o.n_embd() % o.n_head() == 0, "GPT-2: n_embd ", o.n_embd(),
                    " is not a multiple of n_head ", o.n_head());
  for (double p : {o.resid_pdrop(), o.embd_pdrop(), o.attn_pdrop()})
    TORCH_CHECK_VALUE(p >= 0 && p <= 1, "GPT-2: dropout probabilities must be in [0, 1]");
  TORCH_CHECK_VALUE(o.granularity() != Granularity::kBranch,
                    "GPT-2: granularity is block or half, not branch (Inception's)");
  auto chain = std::make_shared<detail::TorchvisionChainImpl>();
  Embeddings embeddings(o);
  chain->add("embeddings", embeddings, "transformer.");
  for (int64_t i = 0; i < o.n_layer(); ++i) {
    const std::string name = "h_" + std::to_string(i);
    const std::string prefix = "transformer.h." + std::to_string(i) + ".";
    if (o.granularity() == Granularity::kBlock) {
      chain->add(name, GPT2Block(o, true, true), prefix);
    } else {
      chain->add(name + "_attention", GPT2Block(o, true, false), prefix);
      chain->add(name + "_mlp", GPT2Block(o, false, true), prefix);
    }
  }
  chain->add("lm_head", LMHead(o, embeddings->wte), "transformer.");
  return detail::as_sequential(chain);
}

namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}
bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void load_gpt2_weights(torch::nn::Sequential& model, const std::vector<StateDictEntry>& entries,
                       const std::string& source) {
  // GPT2Model's names (the published "gpt2" files) have no "transformer." prefix.
  bool prefixed = false;
  for (const auto& entry : entries) prefixed = prefixed || starts_with(entry.name, "transformer.");
  std::vector<StateDictEntry> kept;
  const torch::Tensor* head = nullptr;
  for (const auto& entry : entries) {
    if (entry.name == "lm_head.weight") {
      head = &entry.tensor;
      continue;
    }
    // The causal mask older versions saved as buffers: constants, not weights.
    if (ends_with(entry.name, ".attn.bias") || ends_with(entry.name, ".attn.masked_bias")) continue;
    kept.push_back({prefixed ? entry.name : "transformer." + entry.name, entry.tensor});
  }
  if (head != nullptr) {
    const StateDictEntry* wte = nullptr;
    for (const auto& entry : kept)
      if (entry.name == "transformer.wte.weight") wte = &entry;
    if (wte != nullptr && !(head->sizes() == wte->tensor.sizes() && torch::equal(*head, wte->tensor)))
      throw WeightsError(source + ": lm_head.weight differs from transformer.wte.weight; GPT-2 "
                                  "ties them (tie_word_embeddings), and so does this port");
  }
  load_torchvision_weights(model, kept, source);
}

void load_gpt2_weights(torch::nn::Sequential& model, const std::string& path) {
  // A torch.save file is a zip ("PK") or a legacy pickle (0x80); safetensors starts with the
  // header's length.
  char magic[2] = {0, 0};
  std::ifstream(path, std::ios::binary).read(magic, 2);
  const bool torch_save = (magic[0] == 'P' && magic[1] == 'K') || magic[0] == '\x80';
  load_gpt2_weights(model, torch_save ? read_state_dict(path) : read_safetensors(path), path);
}

}  // namespace remat::models
