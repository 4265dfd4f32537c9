#pragma once
// Transformers as chains: torchvision's Vision Transformer and Hugging Face's GPT-2.
//
// Stage granularity. Granularity::kBlock makes each encoder block one stage; kHalfBlock makes it
// two, its attention half (LayerNorm, self-attention, residual) and its MLP half (LayerNorm,
// MLP, residual), so that the schedule can keep the narrow residual stream and recompute the
// wide MLP activations, or the other way round. The parameters keep their reference names
// either way, so the same weights load into both.
//
// Vision Transformer (torchvision's VisionTransformer): stages "embed" (conv_proj patches, class
// token, position embedding, dropout), "encoder_layer_0" ... (or "encoder_layer_0_attention",
// "encoder_layer_0_mlp", ...), and "heads" (the class token's encoder.ln, then heads.head).
// Outputs equal torchvision's; its published weights load with load_torchvision_weights.
//
// GPT-2 (Hugging Face's GPT2LMHeadModel): stages "embeddings" (wte, wpe, dropout), "h_0" ...
// (or "h_0_attention", "h_0_mlp", ...), and "lm_head" (transformer.ln_f, the head tied to wte,
// and with GPT2Options::loss the causal language-model loss). The chain's input is the token
// ids, a (batch, sequence) integer tensor; every activation is {hidden states, token ids}, the
// ids carried from stage to stage unchanged (one storage, no gradient) so that the last stage
// can take its labels from them, as `GPT2LMHeadModel(ids, labels=ids)` does. Its output is
// {loss} (a scalar) with GPT2Options::loss, else {logits}. The stages take their members as one
// list (remat::MemberListModule), so the Sequential runs too:
// `net->forward<std::vector<torch::Tensor>>(ids)`. Weights load from Hugging Face's files with
// load_gpt2_weights.

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

#include "remat/base/arg.h"  // REMAT_ARG
#include "remat/models/granularity.h"  // one stage per block (kBlock) or two (kHalfBlock)
#include "remat/models/state_dict.h"

namespace remat::models {


struct ViTOptions {
  /// Input height and width (square; a multiple of patch_size). The position embedding has
  /// (image_size / patch_size)^2 + 1 entries, so weights load only at the image size they were
  /// trained at (224 for torchvision's published weights).
  REMAT_ARG(int64_t, image_size) = 224;
  REMAT_ARG(int64_t, patch_size) = 16;
  REMAT_ARG(int64_t, num_layers) = 12;
  REMAT_ARG(int64_t, num_heads) = 12;
  REMAT_ARG(int64_t, hidden_dim) = 768;
  REMAT_ARG(int64_t, mlp_dim) = 3072;
  REMAT_ARG(double, dropout) = 0.0;
  REMAT_ARG(double, attention_dropout) = 0.0;
  REMAT_ARG(int64_t, num_classes) = 1000;
  REMAT_ARG(Granularity, granularity) = Granularity::kBlock;
};

/// torchvision's VisionTransformer with these options (its initialization included).
torch::nn::Sequential vision_transformer(const ViTOptions& options = ViTOptions());
/// ViT-B/16: 86,567,656 parameters at 1000 classes and 224x224. The options' patch_size,
/// num_layers, num_heads, hidden_dim and mlp_dim are replaced by the model's.
torch::nn::Sequential vit_b_16(ViTOptions options = ViTOptions());
/// ViT-B/32: 88,224,232 parameters.
torch::nn::Sequential vit_b_32(ViTOptions options = ViTOptions());
/// ViT-L/16: 304,326,632 parameters.
torch::nn::Sequential vit_l_16(ViTOptions options = ViTOptions());

struct GPT2Options {
  REMAT_ARG(int64_t, vocab_size) = 50257;
  /// Longest sequence (the position embedding's size).
  REMAT_ARG(int64_t, n_positions) = 1024;
  REMAT_ARG(int64_t, n_embd) = 768;
  REMAT_ARG(int64_t, n_layer) = 12;
  REMAT_ARG(int64_t, n_head) = 12;
  /// The MLP's inner width; 0: 4 * n_embd (Hugging Face's n_inner=None).
  REMAT_ARG(int64_t, n_inner) = 0;
  REMAT_ARG(double, resid_pdrop) = 0.1;
  REMAT_ARG(double, embd_pdrop) = 0.1;
  REMAT_ARG(double, attn_pdrop) = 0.1;
  REMAT_ARG(double, layer_norm_epsilon) = 1e-5;
  /// The last stage returns the causal language-model loss ({loss}), else the logits.
  REMAT_ARG(bool, loss) = true;
  REMAT_ARG(Granularity, granularity) = Granularity::kBlock;
};

/// GPT-2 with these options, initialized as Hugging Face does (normal(0, 0.02), the residual
/// projections with 0.02 / sqrt(2 n_layer), LayerNorm 1 and 0, biases 0).
torch::nn::Sequential gpt2(const GPT2Options& options = GPT2Options());
/// The four published configurations ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl": 12, 24,
/// 36 and 48 layers of width 768, 1024, 1280 and 1600 with 12, 16, 20 and 25 heads) applied
/// to `options`. Throws c10::ValueError for another name.
GPT2Options gpt2_config(const std::string& name, GPT2Options options = GPT2Options());
/// Parameters of gpt2(options) (the head shares wte's): 124,439,808 for "gpt2", 354,823,168,
/// 774,030,080 and 1,557,611,200 for the others. Computed, not built.
std::int64_t gpt2_parameter_count(const GPT2Options& options);

/// Loads Hugging Face's GPT-2 weights into `model` (built by gpt2()): `model.safetensors`
/// (read_safetensors) or `pytorch_model.bin` (torch.save; read_state_dict), chosen by the
/// file's first bytes. Accepts the names of GPT2LMHeadModel ("transformer.h.0.attn.c_attn.weight")
/// and of GPT2Model, as the published "gpt2" files have them ("h.0.attn.c_attn.weight"); ignores
/// the causal-mask buffers older files carry ("h.0.attn.bias", "h.0.attn.masked_bias"); a
/// "lm_head.weight" must equal "transformer.wte.weight" (GPT-2 ties them). Otherwise as
/// load_torchvision_weights: nothing changes unless everything fits; WeightsError lists what
/// does not.
void load_gpt2_weights(torch::nn::Sequential& model, const std::string& path);
/// The same from entries already read; `source` names them in errors.
void load_gpt2_weights(torch::nn::Sequential& model, const std::vector<StateDictEntry>& entries,
                       const std::string& source = "state dict");

/// GPT2LMHeadModel's loss: the mean cross-entropy of the logits at each position against the
/// next token (the last position has none). logits: (batch, sequence, vocabulary); ids: (batch,
/// sequence).
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& ids);

}  // namespace remat::models
