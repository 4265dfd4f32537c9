// torchvision.models.inception_v3 (v0.14) as a chain: one stage per BasicConv2d of the stem,
// per pooling and per "Mixed" block. See inception.h for the auxiliary classifier.
#include "remat/models/inception.h"

#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/pooling.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "layers.h"
#include "remat/core/stage.h"

namespace remat::models {
namespace {

namespace nn = torch::nn;
using torch::Tensor;

/// Conv (no bias) + BatchNorm (eps 0.001) + ReLU: torchvision's BasicConv2d.
class BasicConv2dImpl : public nn::Module {
 public:
  BasicConv2dImpl(int64_t in, int64_t out, torch::ExpandingArray<2> kernel,
                  torch::ExpandingArray<2> stride = 1, torch::ExpandingArray<2> padding = 0)
      : conv(register_module("conv", detail::conv2d(in, out, kernel, stride, padding))),
        bn(register_module("bn", nn::BatchNorm2d(nn::BatchNormOptions(out).eps(0.001)))) {}
  Tensor forward(const Tensor& x) { return bn(conv(x)).relu_(); }

  nn::Conv2d conv;
  nn::BatchNorm2d bn;
};
TORCH_MODULE(BasicConv2d);

/// One branch of a Mixed block: its convolutions (torchvision's member names) and how it maps
/// the block's input to its part of the block's output.
struct Branch {
  std::string name;  // the branch's first member, e.g. "branch5x5" for branch5x5_1, _2
  std::vector<std::pair<std::string, BasicConv2d>> convs;
  std::function<Tensor(const Tensor&)> run;
};

/// Base of the Mixed blocks: registers BasicConv2d members by torchvision's names; the block's
/// output is its branches' outputs concatenated along the channels, in order.
class MixedImpl : public nn::Module {
 public:
  const std::vector<Branch>& branches() const { return branches_; }
  Tensor forward(const Tensor& x) {
    std::vector<Tensor> parts;
    parts.reserve(branches_.size());
    for (const Branch& branch : branches_) parts.push_back(branch.run(x));
    return torch::cat(parts, 1);
  }

 protected:
  void add_branch(std::string name, std::vector<BasicConv2d> convs,
                  std::function<Tensor(const Tensor&)> run) {
    Branch branch{std::move(name), {}, std::move(run)};
    for (BasicConv2d& conv : convs) branch.convs.emplace_back(conv_names_.at(conv.get()), conv);
    branches_.push_back(std::move(branch));
  }
  BasicConv2d conv(const std::string& name, int64_t in, int64_t out,
                   torch::ExpandingArray<2> kernel, torch::ExpandingArray<2> stride = 1,
                   torch::ExpandingArray<2> padding = 0) {
    BasicConv2d conv = register_module(name, BasicConv2d(in, out, kernel, stride, padding));
    conv_names_[conv.get()] = name;
    return conv;
  }
  static Tensor avg_pool_3x3(const Tensor& x) {
    return torch::avg_pool2d(x, {3, 3}, {1, 1}, {1, 1});
  }
  static Tensor max_pool_3x3_stride_2(const Tensor& x) {
    return torch::max_pool2d(x, {3, 3}, {2, 2});
  }

 private:
  std::map<const BasicConv2dImpl*, std::string> conv_names_;
  std::vector<Branch> branches_;
};

class InceptionAImpl : public MixedImpl {
 public:
  InceptionAImpl(int64_t in, int64_t pool_features)
      : b1x1(conv("branch1x1", in, 64, 1)),
        b5x5_1(conv("branch5x5_1", in, 48, 1)),
        b5x5_2(conv("branch5x5_2", 48, 64, 5, 1, 2)),
        b3x3dbl_1(conv("branch3x3dbl_1", in, 64, 1)),
        b3x3dbl_2(conv("branch3x3dbl_2", 64, 96, 3, 1, 1)),
        b3x3dbl_3(conv("branch3x3dbl_3", 96, 96, 3, 1, 1)),
        bpool(conv("branch_pool", in, pool_features, 1)) {
    add_branch("branch1x1", {b1x1}, [c = b1x1](const Tensor& x) mutable { return c(x); });
    add_branch("branch5x5", {b5x5_1, b5x5_2},
               [c1 = b5x5_1, c2 = b5x5_2](const Tensor& x) mutable { return c2(c1(x)); });
    add_branch("branch3x3dbl", {b3x3dbl_1, b3x3dbl_2, b3x3dbl_3},
               [c1 = b3x3dbl_1, c2 = b3x3dbl_2, c3 = b3x3dbl_3](const Tensor& x) mutable {
                 return c3(c2(c1(x)));
               });
    add_branch("branch_pool", {bpool},
               [c = bpool](const Tensor& x) mutable { return c(avg_pool_3x3(x)); });
  }
  BasicConv2d b1x1, b5x5_1, b5x5_2, b3x3dbl_1, b3x3dbl_2, b3x3dbl_3, bpool;
};
TORCH_MODULE(InceptionA);

class InceptionBImpl : public MixedImpl {
 public:
  explicit InceptionBImpl(int64_t in)
      : b3x3(conv("branch3x3", in, 384, 3, 2)),
        b3x3dbl_1(conv("branch3x3dbl_1", in, 64, 1)),
        b3x3dbl_2(conv("branch3x3dbl_2", 64, 96, 3, 1, 1)),
        b3x3dbl_3(conv("branch3x3dbl_3", 96, 96, 3, 2)) {
    add_branch("branch3x3", {b3x3}, [c = b3x3](const Tensor& x) mutable { return c(x); });
    add_branch("branch3x3dbl", {b3x3dbl_1, b3x3dbl_2, b3x3dbl_3},
               [c1 = b3x3dbl_1, c2 = b3x3dbl_2, c3 = b3x3dbl_3](const Tensor& x) mutable {
                 return c3(c2(c1(x)));
               });
    add_branch("branch_pool", {}, max_pool_3x3_stride_2);
  }
  BasicConv2d b3x3, b3x3dbl_1, b3x3dbl_2, b3x3dbl_3;
};
TORCH_MODULE(InceptionB);

class InceptionCImpl : public MixedImpl {
 public:
  InceptionCImpl(int64_t in, int64_t c7)
      : b1x1(conv("branch1x1", in, 192, 1)),
        b7x7_1(conv("branch7x7_1", in, c7, 1)),
        b7x7_2(conv("branch7x7_2", c7, c7, {1, 7}, 1, {0, 3})),
        b7x7_3(conv("branch7x7_3", c7, 192, {7, 1}, 1, {3, 0})),
        b7x7dbl_1(conv("branch7x7dbl_1", in, c7, 1)),
        b7x7dbl_2(conv("branch7x7dbl_2", c7, c7, {7, 1}, 1, {3, 0})),
        b7x7dbl_3(conv("branch7x7dbl_3", c7, c7, {1, 7}, 1, {0, 3})),
        b7x7dbl_4(conv("branch7x7dbl_4", c7, c7, {7, 1}, 1, {3, 0})),
        b7x7dbl_5(conv("branch7x7dbl_5", c7, 192, {1, 7}, 1, {0, 3})),
        bpool(conv("branch_pool", in, 192, 1)) {
    add_branch("branch1x1", {b1x1}, [c = b1x1](const Tensor& x) mutable { return c(x); });
    add_branch("branch7x7", {b7x7_1, b7x7_2, b7x7_3},
               [c1 = b7x7_1, c2 = b7x7_2, c3 = b7x7_3](const Tensor& x) mutable {
                 return c3(c2(c1(x)));
               });
    add_branch("branch7x7dbl", {b7x7dbl_1, b7x7dbl_2, b7x7dbl_3, b7x7dbl_4, b7x7dbl_5},
               [c1 = b7x7dbl_1, c2 = b7x7dbl_2, c3 = b7x7dbl_3, c4 = b7x7dbl_4,
                c5 = b7x7dbl_5](const Tensor& x) mutable { return c5(c4(c3(c2(c1(x))))); });
    add_branch("branch_pool", {bpool},
               [c = bpool](const Tensor& x) mutable { return c(avg_pool_3x3(x)); });
  }
  BasicConv2d b1x1, b7x7_1, b7x7_2, b7x7_3, b7x7dbl_1, b7x7dbl_2, b7x7dbl_3, b7x7dbl_4,
      b7x7dbl_5, bpool;
};
TORCH_MODULE(InceptionC);

class InceptionDImpl : public MixedImpl {
 public:
  explicit InceptionDImpl(int64_t in)
      : b3x3_1(conv("branch3x3_1", in, 192, 1)),
        b3x3_2(conv("branch3x3_2", 192, 320, 3, 2)),
        b7x7x3_1(conv("branch7x7x3_1", in, 192, 1)),
        b7x7x3_2(conv("branch7x7x3_2", 192, 192, {1, 7}, 1, {0, 3})),
        b7x7x3_3(conv("branch7x7x3_3", 192, 192, {7, 1}, 1, {3, 0})),
        b7x7x3_4(conv("branch7x7x3_4", 192, 192, 3, 2)) {
    add_branch("branch3x3", {b3x3_1, b3x3_2},
               [c1 = b3x3_1, c2 = b3x3_2](const Tensor& x) mutable { return c2(c1(x)); });
    add_branch("branch7x7x3", {b7x7x3_1, b7x7x3_2, b7x7x3_3, b7x7x3_4},
               [c1 = b7x7x3_1, c2 = b7x7x3_2, c3 = b7x7x3_3, c4 = b7x7x3_4](const Tensor& x) mutable {
                 return c4(c3(c2(c1(x))));
               });
    add_branch("branch_pool", {}, max_pool_3x3_stride_2);
  }
  BasicConv2d b3x3_1, b3x3_2, b7x7x3_1, b7x7x3_2, b7x7x3_3, b7x7x3_4;
};
TORCH_MODULE(InceptionD);

class InceptionEImpl : public MixedImpl {
 public:
  explicit InceptionEImpl(int64_t in)
      : b1x1(conv("branch1x1", in, 320, 1)),
        b3x3_1(conv("branch3x3_1", in, 384, 1)),
        b3x3_2a(conv("branch3x3_2a", 384, 384, {1, 3}, 1, {0, 1})),
        b3x3_2b(conv("branch3x3_2b", 384, 384, {3, 1}, 1, {1, 0})),
        b3x3dbl_1(conv("branch3x3dbl_1", in, 448, 1)),
        b3x3dbl_2(conv("branch3x3dbl_2", 448, 384, 3, 1, 1)),
        b3x3dbl_3a(conv("branch3x3dbl_3a", 384, 384, {1, 3}, 1, {0, 1})),
        b3x3dbl_3b(conv("branch3x3dbl_3b", 384, 384, {3, 1}, 1, {1, 0})),
        bpool(conv("branch_pool", in, 192, 1)) {
    add_branch("branch1x1", {b1x1}, [c = b1x1](const Tensor& x) mutable { return c(x); });
    add_branch("branch3x3", {b3x3_1, b3x3_2a, b3x3_2b},
               [c1 = b3x3_1, a = b3x3_2a, b = b3x3_2b](const Tensor& x) mutable {
                 Tensor t = c1(x);
                 return torch::cat({a(t), b(t)}, 1);
               });
    add_branch("branch3x3dbl", {b3x3dbl_1, b3x3dbl_2, b3x3dbl_3a, b3x3dbl_3b},
               [c1 = b3x3dbl_1, c2 = b3x3dbl_2, a = b3x3dbl_3a, b = b3x3dbl_3b](const Tensor& x) mutable {
                 Tensor t = c2(c1(x));
                 return torch::cat({a(t), b(t)}, 1);
               });
    add_branch("branch_pool", {bpool},
               [c = bpool](const Tensor& x) mutable { return c(avg_pool_3x3(x)); });
  }
  BasicConv2d b1x1, b3x3_1, b3x3_2a, b3x3_2b, b3x3dbl_1, b3x3dbl_2, b3x3dbl_3a, b3x3dbl_3b,
      bpool;
};
TORCH_MODULE(InceptionE);

/// AuxLogits: returns the members {features, aux_logits} in training mode, {features} in eval
/// mode (torchvision skips the auxiliary head there). The features are its input, carried.
class InceptionAuxImpl : public MixedImpl {
 public:
  InceptionAuxImpl(int64_t in, int64_t classes)
      : conv0(conv("conv0", in, 128, 1)),
        conv1(conv("conv1", 128, 768, 5)),
        fc(register_module("fc", nn::Linear(768, classes))) {}
  std::vector<Tensor> forward(const Tensor& x) {
    if (!is_training()) return {x};
    TORCH_CHECK_VALUE(x.size(2) >= 17 && x.size(3) >= 17,
                      "Inception v3's auxiliary classifier needs Mixed_6e's output to be at least "
                      "17x17 (a 299x299 input), got ",
                      x.size(2), "x", x.size(3), "; build the model with aux_logits(false)");
    Tensor aux = conv1(conv0(torch::avg_pool2d(x, {5, 5}, {3, 3})));
    aux = fc(torch::adaptive_avg_pool2d(aux, {1, 1}).flatten(1));
    return {x, aux};
  }
  BasicConv2d conv0, conv1;
  nn::Linear fc;
};
TORCH_MODULE(InceptionAux);

/// The first stage: optional input transform, then Conv2d_1a_3x3.
class InputStemImpl : public nn::Module {
 public:
  explicit InputStemImpl(bool transform_input)
      : transform_input_(transform_input),
        conv_(register_module("Conv2d_1a_3x3", BasicConv2d(3, 32, 3, 2))) {}
  Tensor forward(const Tensor& x) {
    if (!transform_input_) return conv_(x);
    // torchvision's _transform_input: from ImageNet normalization to [-1, 1].
    Tensor t = torch::cat({x.narrow(1, 0, 1) * (0.229 / 0.5) + (0.485 - 0.5) / 0.5,
                           x.narrow(1, 1, 1) * (0.224 / 0.5) + (0.456 - 0.5) / 0.5,
                           x.narrow(1, 2, 1) * (0.225 / 0.5) + (0.406 - 0.5) / 0.5},
                          1);
    return conv_(t);
  }

 private:
  bool transform_input_;
  BasicConv2d conv_;
};
TORCH_MODULE(InputStem);

/// avgpool, dropout, flatten, fc.
class InceptionHeadImpl : public nn::Module {
 public:
  InceptionHeadImpl(int64_t classes, double dropout)
      : dropout_(register_module("dropout", nn::Dropout(nn::DropoutOptions(dropout)))),
        fc_(register_module("fc", nn::Linear(2048, classes))) {}
  Tensor forward(const Tensor& x) {
    return fc_(dropout_(torch::adaptive_avg_pool2d(x, {1, 1})).flatten(1));
  }

 private:
  nn::Dropout dropout_;
  nn::Linear fc_;
};
TORCH_MODULE(InceptionHead);

/// Branch granularity: the stage of branch `index` of a Mixed block (of `count`). It runs the
/// branch on the block's input, members[0], and returns the members with its output after
/// the `index` finished branches: {x, b_0, ..., b_index, rest...}, everything else carried. The
/// last branch's stage returns {cat(b_0, ..., b_last), rest...}, the block's output.
class BranchStageImpl : public nn::Module, public remat::MemberListModule {
 public:
  BranchStageImpl(const Branch& branch, std::size_t index, std::size_t count)
      : run_(branch.run), index_(static_cast<std::ptrdiff_t>(index)), last_(index + 1 == count) {
    for (const auto& [name, conv] : branch.convs) register_module(name, conv);
  }
  std::vector<Tensor> forward(std::vector<Tensor> members) {
    TORCH_CHECK_VALUE(static_cast<std::ptrdiff_t>(members.size()) > index_,
                      "Inception v3: the stage of a Mixed block's branch ", index_,
                      " takes the block's input and the ", index_, " branches before it; got ",
                      members.size(), " tensors");
    Tensor out = run_(members[0]);
    const auto finished_end = members.begin() + 1 + index_;
    if (!last_) {
      members.insert(finished_end, std::move(out));
      return members;
    }
    std::vector<Tensor> parts(members.begin() + 1, finished_end);
    parts.push_back(std::move(out));
    std::vector<Tensor> result{torch::cat(parts, 1)};
    result.insert(result.end(), finished_end, members.end());
    return result;
  }

 private:
  std::function<Tensor(const Tensor&)> run_;
  std::ptrdiff_t index_;
  bool last_;
};

/// Branch granularity: a stage that maps a tensor to a tensor, returning it as the list
/// {output} (maxpool2, before the first Mixed block's branches).
template <typename Inner>
class ToMembersImpl : public nn::Module {
 public:
  explicit ToMembersImpl(Inner inner) : inner_(register_module("inner", std::move(inner))) {}
  std::vector<Tensor> forward(const Tensor& x) { return {inner_(x)}; }

 private:
  Inner inner_;
};

/// Branch granularity: AuxLogits taking {features} (the last branch stage's output).
class MembersAuxImpl : public InceptionAuxImpl, public remat::MemberListModule {
 public:
  using InceptionAuxImpl::InceptionAuxImpl;
  std::vector<Tensor> forward(std::vector<Tensor> members) {
    TORCH_CHECK_VALUE(members.size() == 1, "Inception v3: AuxLogits takes Mixed_6e's output; got ",
                      members.size(), " tensors");
    return InceptionAuxImpl::forward(members[0]);
  }
};

/// With the auxiliary classifier, the stages after it take and return the members {features,
/// aux_logits} ({features} in eval mode) as one list (remat::MemberListModule, so that the
/// Sequential chains them too): they transform the features and return the auxiliary logits as
/// they came, a carried member (one storage; its gradient passed back unchanged).
template <typename Block>
class CarriesAuxImpl : public Block, public remat::MemberListModule {
 public:
  using Block::Block;
  std::vector<Tensor> forward(std::vector<Tensor> members) {
    TORCH_CHECK_VALUE(members.size() == 1 || members.size() == 2,
                      "Inception v3: a stage after AuxLogits takes the features and, in training "
                      "mode, the auxiliary logits; got ",
                      members.size(), " tensors");
    members[0] = Block::forward(members[0]);
    return members;
  }
};

}  // namespace

torch::nn::Sequential inception_v3(const InceptionV3Options& options) {
  const int64_t classes = options.num_classes();
  TORCH_CHECK_VALUE(classes >= 1, "inception_v3: num_classes must be >= 1");
  TORCH_CHECK_VALUE(options.dropout() >= 0 && options.dropout() <= 1,
                    "inception_v3: dropout must be in [0, 1]");
  TORCH_CHECK_VALUE(options.granularity() != Granularity::kHalfBlock,
                    "inception_v3: granularity is block or branch, not half (a transformer's)");
  const bool branches = options.granularity() == Granularity::kBranch;
  auto chain = std::make_shared<detail::TorchvisionChainImpl>();
  chain->add("Conv2d_1a_3x3", InputStem(options.transform_input()), "");
  chain->add("Conv2d_2a_3x3", BasicConv2d(32, 32, 3), "Conv2d_2a_3x3.");
  chain->add("Conv2d_2b_3x3", BasicConv2d(32, 64, 3, 1, 1), "Conv2d_2b_3x3.");
  chain->add("maxpool1", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2)), "maxpool1.");
  chain->add("Conv2d_3b_1x1", BasicConv2d(64, 80, 1), "Conv2d_3b_1x1.");
  chain->add("Conv2d_4a_3x3", BasicConv2d(80, 192, 3), "Conv2d_4a_3x3.");
  const nn::MaxPool2d maxpool2(nn::MaxPool2dOptions(3).stride(2));
  if (branches)
    chain->add("maxpool2", std::make_shared<ToMembersImpl<nn::MaxPool2d>>(maxpool2), "maxpool2.");
  else
    chain->add("maxpool2", maxpool2, "maxpool2.");
  // A Mixed block: one stage, or one per branch.
  const auto mixed = [&](const std::string& name, auto block) {
    if (!branches) {
      chain->add(name, block, name + ".");
      return;
    }
    const std::vector<Branch>& parts = block->branches();
    for (std::size_t k = 0; k < parts.size(); ++k)
      chain->add(name + "_" + parts[k].name,
                 std::make_shared<BranchStageImpl>(parts[k], k, parts.size()), name + ".");
  };
  mixed("Mixed_5b", InceptionA(192, 32));
  mixed("Mixed_5c", InceptionA(256, 64));
  mixed("Mixed_5d", InceptionA(288, 64));
  mixed("Mixed_6a", InceptionB(288));
  mixed("Mixed_6b", InceptionC(768, 128));
  mixed("Mixed_6c", InceptionC(768, 160));
  mixed("Mixed_6d", InceptionC(768, 160));
  mixed("Mixed_6e", InceptionC(768, 192));
  std::shared_ptr<InceptionAuxImpl> aux;
  if (options.aux_logits()) {
    if (branches) {
      aux = std::make_shared<MembersAuxImpl>(768, classes);
      chain->add("AuxLogits", std::static_pointer_cast<MembersAuxImpl>(aux), "AuxLogits.");
    } else {
      aux = std::make_shared<InceptionAuxImpl>(768, classes);
      chain->add("AuxLogits", InceptionAux(aux), "AuxLogits.");
    }
  }
  // With the auxiliary classifier at block granularity, the blocks after it carry the
  // auxiliary logits (CarriesAuxImpl); at branch granularity the branch stages carry them.
  if (branches || !options.aux_logits()) {
    mixed("Mixed_7a", InceptionD(768));
    mixed("Mixed_7b", InceptionE(1280));
    mixed("Mixed_7c", InceptionE(2048));
  } else {
    chain->add("Mixed_7a", std::make_shared<CarriesAuxImpl<InceptionDImpl>>(768), "Mixed_7a.");
    chain->add("Mixed_7b", std::make_shared<CarriesAuxImpl<InceptionEImpl>>(1280), "Mixed_7b.");
    chain->add("Mixed_7c", std::make_shared<CarriesAuxImpl<InceptionEImpl>>(2048), "Mixed_7c.");
  }
  if (branches || options.aux_logits())
    chain->add("fc",
               std::make_shared<CarriesAuxImpl<InceptionHeadImpl>>(classes, options.dropout()), "");
  else
    chain->add("fc", InceptionHead(classes, options.dropout()), "");

  // torchvision: trunc_normal_(std = 0.1, or the module's `stddev`: 0.01 for AuxLogits.conv1,
  // 0.001 for AuxLogits.fc; bounds -2, 2) on every Conv2d and Linear weight; BN at 1 and 0.
  detail::for_each<nn::Conv2dImpl>(
      *chain, [](nn::Conv2dImpl& conv) { detail::trunc_normal_(conv.weight, 0, 0.1, -2, 2); });
  detail::for_each<nn::LinearImpl>(*chain, [](nn::LinearImpl& linear) {
    detail::trunc_normal_(linear.weight, 0, 0.1, -2, 2);
  });
  if (aux) {
    detail::trunc_normal_(aux->conv1->conv->weight, 0, 0.01, -2, 2);
    detail::trunc_normal_(aux->fc->weight, 0, 0.001, -2, 2);
  }
  return detail::as_sequential(chain);
}

}  // namespace remat::models
