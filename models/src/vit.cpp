// torchvision.models.vision_transformer as a chain: the patch embedding, one stage per encoder
// block (or two, Granularity::kHalfBlock), and the head.
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <string>

#include "layers.h"
#include "remat/models/transformer.h"

namespace remat::models {

Granularity parse_granularity(const std::string& text) {
  if (text == "block") return Granularity::kBlock;
  if (text == "half") return Granularity::kHalfBlock;
  if (text == "branch") return Granularity::kBranch;
  TORCH_CHECK_VALUE(false, "unknown granularity '", text,
                    "' (expected block: one stage per block; half: two per transformer block, "
                    "attention and MLP; branch: one per branch of Inception's Mixed blocks)");
}

const char* granularity_name(Granularity granularity) {
  switch (granularity) {
    case Granularity::kBlock: return "block";
    case Granularity::kHalfBlock: return "half";
    case Granularity::kBranch: return "branch";
  }
  return "?";
}

namespace {

namespace nn = torch::nn;
using torch::Tensor;

nn::LayerNorm layer_norm(int64_t dim, double eps) {
  return nn::LayerNorm(nn::LayerNormOptions({dim}).eps(eps));
}

/// The patches (conv_proj), the class token in front, the position embedding added, dropout:
/// torchvision's _process_input, the class token's concatenation and Encoder's first lines.
class PatchEmbeddingImpl : public nn::Module {
 public:
  explicit PatchEmbeddingImpl(const ViTOptions& o)
      : image_size_(o.image_size()),
        patch_size_(o.patch_size()),
        hidden_(o.hidden_dim()),
        conv_proj_(register_module(
            "conv_proj", nn::Conv2d(nn::Conv2dOptions(3, o.hidden_dim(), o.patch_size())
                                        .stride(o.patch_size())))),
        class_token_(register_parameter("class_token", torch::zeros({1, 1, o.hidden_dim()}))),
        pos_embedding_(register_parameter(
            "pos_embedding",
            torch::empty({1, (o.image_size() / o.patch_size()) * (o.image_size() / o.patch_size()) + 1,
                          o.hidden_dim()})
                .normal_(0, 0.02))),
        dropout_(register_module("dropout", nn::Dropout(o.dropout()))) {
    // torchvision: trunc_normal_(std = sqrt(1 / fan_in)) and zero bias.
    const double fan_in = 3.0 * double(patch_size_ * patch_size_);
    detail::trunc_normal_(conv_proj_->weight, 0, std::sqrt(1 / fan_in), -2, 2);
    torch::NoGradGuard no_grad;
    conv_proj_->bias.zero_();
  }

  Tensor forward(const Tensor& x) {
    TORCH_CHECK_VALUE(x.dim() == 4 && x.size(1) == 3,
                      "vision transformer: expected images of shape (batch, 3, ", image_size_, ", ",
                      image_size_, "), got ", x.sizes());
    TORCH_CHECK_VALUE(x.size(2) == image_size_ && x.size(3) == image_size_,
                      "vision transformer: expected images of ", image_size_, "x", image_size_,
                      " (the size its position embedding was made for), got ", x.size(2), "x",
                      x.size(3));
    const int64_t n = x.size(0), patches = (image_size_ / patch_size_) * (image_size_ / patch_size_);
    Tensor h = conv_proj_(x).reshape({n, hidden_, patches}).permute({0, 2, 1});
    h = torch::cat({class_token_.expand({n, -1, -1}), h}, 1);
    return dropout_(h + pos_embedding_);
  }

 private:
  int64_t image_size_, patch_size_, hidden_;
  nn::Conv2d conv_proj_;
  Tensor class_token_, pos_embedding_;
  nn::Dropout dropout_;
};
TORCH_MODULE(PatchEmbedding);

/// nn.MultiheadAttention(batch_first=True) as torchvision calls it (query = key = value,
/// need_weights=False): its parameters in_proj_weight, in_proj_bias, out_proj.
class SelfAttentionImpl : public nn::Module {
 public:
  SelfAttentionImpl(int64_t dim, int64_t heads, double dropout)
      : heads_(heads),
        dropout_(dropout),
        in_proj_weight_(register_parameter("in_proj_weight", torch::empty({3 * dim, dim}))),
        in_proj_bias_(register_parameter("in_proj_bias", torch::zeros({3 * dim}))),
        out_proj_(register_module("out_proj", nn::Linear(dim, dim))) {
    TORCH_CHECK_VALUE(dim % heads == 0, "vision transformer: hidden_dim ", dim,
                      " is not a multiple of num_heads ", heads);
    nn::init::xavier_uniform_(in_proj_weight_);
    torch::NoGradGuard no_grad;
    out_proj_->bias.zero_();
  }

  Tensor forward(const Tensor& x) {
    const int64_t n = x.size(0), len = x.size(1), dim = x.size(2), head = dim / heads_;
    const auto qkv = torch::linear(x, in_proj_weight_, in_proj_bias_).chunk(3, -1);
    const auto split = [&](const Tensor& t) { return t.view({n, len, heads_, head}).transpose(1, 2); };
    const Tensor out = detail::attention(split(qkv[0]), split(qkv[1]), split(qkv[2]),
                                         /*causal=*/false, is_training() ? dropout_ : 0.0);
    return out_proj_(out.transpose(1, 2).reshape({n, len, dim}));
  }

 private:
  int64_t heads_;
  double dropout_;
  Tensor in_proj_weight_, in_proj_bias_;
  nn::Linear out_proj_;
};
TORCH_MODULE(SelfAttention);

/// torchvision's EncoderBlock, or one of its halves: x + dropout(attention(ln_1(x))), then
/// x + mlp(ln_2(x)), the MLP being Linear, GELU, Dropout, Linear, Dropout ("mlp.0", "mlp.3").
class EncoderBlockImpl : public nn::Module {
 public:
  EncoderBlockImpl(const ViTOptions& o, bool attention_half, bool mlp_half) {
    if (attention_half) {
      ln_1_ = register_module("ln_1", layer_norm(o.hidden_dim(), 1e-6));
      self_attention_ = register_module(
          "self_attention", SelfAttention(o.hidden_dim(), o.num_heads(), o.attention_dropout()));
      dropout_ = register_module("dropout", nn::Dropout(o.dropout()));
    }
    if (mlp_half) {
      ln_2_ = register_module("ln_2", layer_norm(o.hidden_dim(), 1e-6));
      nn::Linear fc1(o.hidden_dim(), o.mlp_dim()), fc2(o.mlp_dim(), o.hidden_dim());
      // torchvision's MLPBlock: xavier_uniform_ weights, normal(std=1e-6) biases.
      for (nn::Linear& fc : {std::ref(fc1), std::ref(fc2)}) {
        nn::init::xavier_uniform_(fc->weight);
        nn::init::normal_(fc->bias, 0, 1e-6);
      }
      mlp_ = register_module("mlp", Block(fc1, nn::GELU(), nn::Dropout(o.dropout()), fc2,
                                          nn::Dropout(o.dropout())));
    }
  }

  Tensor forward(Tensor x) {
    if (self_attention_) x = dropout_(self_attention_(ln_1_(x))) + x;
    if (mlp_) x = x + mlp_(ln_2_(x));
    return x;
  }

 private:
  nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  SelfAttention self_attention_{nullptr};
  nn::Dropout dropout_{nullptr};
  Block mlp_{nullptr};
};
TORCH_MODULE(EncoderBlock);

/// encoder.ln on the class token (LayerNorm works token by token: the other tokens' are not
/// needed), then heads.head.
class ViTHeadImpl : public nn::Module {
 public:
  explicit ViTHeadImpl(const ViTOptions& o)
      : ln_(register_module("ln", layer_norm(o.hidden_dim(), 1e-6))),
        head_(register_module("head", nn::Linear(o.hidden_dim(), o.num_classes()))) {
    torch::NoGradGuard no_grad;  // torchvision zeroes the head
    head_->weight.zero_();
    head_->bias.zero_();
  }
  Tensor forward(const Tensor& x) { return head_(ln_(x.select(1, 0))); }

 private:
  nn::LayerNorm ln_;
  nn::Linear head_;
};
TORCH_MODULE(ViTHead);

ViTOptions with_shape(ViTOptions o, int64_t patch, int64_t layers, int64_t heads, int64_t hidden,
                      int64_t mlp) {
  return o.patch_size(patch).num_layers(layers).num_heads(heads).hidden_dim(hidden).mlp_dim(mlp);
}

}  // namespace

torch::nn::Sequential vision_transformer(const ViTOptions& o) {
  TORCH_CHECK_VALUE(o.patch_size() >= 1 && o.image_size() >= o.patch_size() &&
                        o.image_size() % o.patch_size() == 0,
                    "vision transformer: image_size ", o.image_size(),
                    " must be a positive multiple of patch_size ", o.patch_size());
  TORCH_CHECK_VALUE(o.num_layers() >= 1 && o.num_heads() >= 1 && o.hidden_dim() >= 1 &&
                        o.mlp_dim() >= 1 && o.num_classes() >= 1,
                    "vision transformer: num_layers, num_heads, hidden_dim, mlp_dim and "
                    "num_classes must be >= 1");
  TORCH_CHECK_VALUE(o.dropout() >= 0 && o.dropout() <= 1 && o.attention_dropout() >= 0 &&
                        o.attention_dropout() <= 1,
                    "vision transformer: dropout and attention_dropout must be in [0, 1]");
  TORCH_CHECK_VALUE(o.granularity() != Granularity::kBranch,
                    "vision transformer: granularity is block or half, not branch (Inception's)");
  auto chain = std::make_shared<detail::TorchvisionChainImpl>();
  chain->add("embed", PatchEmbedding(o), "");
  chain->rename("embed.pos_embedding", "encoder.pos_embedding");
  for (int64_t i = 0; i < o.num_layers(); ++i) {
    const std::string name = "encoder_layer_" + std::to_string(i);
    const std::string prefix = "encoder.layers." + name + ".";
    if (o.granularity() == Granularity::kBlock) {
      chain->add(name, EncoderBlock(o, true, true), prefix);
    } else {
      chain->add(name + "_attention", EncoderBlock(o, true, false), prefix);
      chain->add(name + "_mlp", EncoderBlock(o, false, true), prefix);
    }
  }
  chain->add("heads", ViTHead(o), "heads.");
  chain->rename("heads.ln.", "encoder.ln.");
  return detail::as_sequential(chain);
}

torch::nn::Sequential vit_b_16(ViTOptions options) {
  return vision_transformer(with_shape(std::move(options), 16, 12, 12, 768, 3072));
}
torch::nn::Sequential vit_b_32(ViTOptions options) {
  return vision_transformer(with_shape(std::move(options), 32, 12, 12, 768, 3072));
}
torch::nn::Sequential vit_l_16(ViTOptions options) {
  return vision_transformer(with_shape(std::move(options), 16, 24, 16, 1024, 4096));
}

}  // namespace remat::models
