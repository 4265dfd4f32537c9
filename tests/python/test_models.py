"""Real networks under remat.Checkpointable: torchvision's resnet18, densenet121 and inception_v3
as chains of their own modules, and a transformer with token ids and an attention mask. Against
plain training of the same modules: gradients, BatchNorm statistics and dropout masks are
bit-identical on the CPU, and the tests' own count of memory stays within each budget. Also
torch.autocast (bfloat16 on the CPU)."""

import copy
from collections import OrderedDict

import pytest
import torch
from torch import nn

import remat
from conftest import assert_same_training, check_autocast_training, storage_peak, tensor_bytes

torchvision = pytest.importorskip("torchvision")


# ---- the networks, as chains ---------------------------------------------------------------
# A stage must not change its input in place: torchvision's in-place ReLUs stay inside the stage
# of the operation before them (docs/models.md), as remat's C++ ports have them.


def resnet18_chain() -> nn.Sequential:
    m = torchvision.models.resnet18(num_classes=10)
    stages = [("stem", nn.Sequential(m.conv1, m.bn1, m.relu)), ("maxpool", m.maxpool)]
    for i in range(1, 5):
        stages += [(f"layer{i}_{j}", block) for j, block in enumerate(getattr(m, f"layer{i}"))]
    stages += [("avgpool", m.avgpool), ("flatten", nn.Flatten()), ("fc", m.fc)]
    return nn.Sequential(OrderedDict(stages)), m


def densenet121_chain() -> nn.Sequential:
    m = torchvision.models.densenet121(num_classes=10)
    f = m.features
    stages = [("stem", nn.Sequential(f.conv0, f.norm0, f.relu0)), ("pool0", f.pool0)]
    for i in range(1, 5):
        stages.append((f"denseblock{i}", getattr(f, f"denseblock{i}")))
        if i < 4:
            stages.append((f"transition{i}", getattr(f, f"transition{i}")))
    # DenseNet.forward: relu(features) in place, pool, flatten, classifier.
    stages += [("norm5", nn.Sequential(f.norm5, nn.ReLU(inplace=True))),
               ("pool", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten()), ("classifier", m.classifier)]
    return nn.Sequential(OrderedDict(stages)), m


def inception_v3_chain() -> nn.Sequential:
    m = torchvision.models.inception_v3(num_classes=10, aux_logits=False, init_weights=True)
    names = ["Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1",
             "Conv2d_4a_3x3", "maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
             "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "avgpool", "dropout"]
    stages = [(n, getattr(m, n)) for n in names] + [("flatten", nn.Flatten()), ("fc", m.fc)]
    return nn.Sequential(OrderedDict(stages)), m


class Embed(nn.Module):
    def __init__(self, vocab, d, seq):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.dropout = nn.Dropout(0.1)

    def forward(self, ids, mask):
        return self.dropout(self.tokens(ids) + self.positions)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.1, batch_first=True,
                                                norm_first=True)

    def forward(self, x, mask):
        return self.layer(x, src_mask=mask)


class Head(nn.Module):
    def __init__(self, d, vocab):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, x, mask):
        return self.out(self.norm(x))


def transformer_chain(vocab=97, d=64, heads=4, blocks=4, seq=24) -> nn.Sequential:
    stages = [("embed", Embed(vocab, d, seq))] + [(f"block{i}", Block(d, heads)) for i in range(blocks)]
    return nn.Sequential(OrderedDict(stages + [("head", Head(d, vocab))]))


# ---- plain training and the comparison -----------------------------------------------------


def randomize(model: nn.Module) -> None:
    """Random BatchNorm statistics and affine parameters, so that a mix-up between layers shows."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


def plain_forward(chain: nn.Sequential, inputs, context=()):
    x = tuple(inputs)
    for stage in chain:
        x = stage(*x, *context)
        x = (x,) if isinstance(x, torch.Tensor) else x
    return x[0]


def loss_of(out: torch.Tensor) -> torch.Tensor:
    weights = torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)
    return (out * weights).square().mean()


def check_training(make, inputs, context=(), fractions=("least", 0.5)):
    """Two steps of the chain plainly and under each budget (the least, and fractions of the way
    from it to the store-all peak): equal bit for bit; the peak of the
    tensors alive at once, counted by the tests' own dispatch mode, within the budget."""
    torch.manual_seed(0)
    plain = make()
    randomize(plain)
    grad_input = inputs[0].is_floating_point()
    sample = tuple(t.clone().requires_grad_(grad_input and i == 0) for i, t in enumerate(inputs))
    # Measured with the loss: the memory of its own (large for a language model's logits) is
    # then within the budget too.
    chk = remat.Checkpointable(copy.deepcopy(plain), sample, context=context if context else None,
                               loss=loss_of, repeat=1, progress=False)
    full, least = chk.store_all_peak(), chk.min_budget()
    assert least < full

    def step(model, x, seed, run):
        torch.manual_seed(seed)
        if x.is_floating_point():
            x.grad = None
        loss_of(run(model, x)).backward()

    plain_run = lambda m, x: plain_forward(m, (x,) + tuple(inputs[1:]), context)
    remat_run = lambda m, x: m(x, *inputs[1:], context=context if context else None)

    for fraction in fractions:
        budget = least if fraction == "least" else least + int(fraction * (full - least))
        ours_model = copy.deepcopy(plain)
        ours = remat.Checkpointable(ours_model, context=context if context else None, progress=False)
        ours.set_chain(chk.chain)
        solution = ours.compute_sequence(budget)
        assert solution.ok
        if fraction == "least":
            assert "Fn" in solution.sequence or "CF" in solution.sequence  # something is recomputed
        reference = copy.deepcopy(plain)
        # The second step starts from the first's BatchNorm statistics, and from its parameter
        # gradients: it accumulates into them and allocates none (they are not activations).
        for seed in (1, 2):
            x_plain = inputs[0].clone().requires_grad_(grad_input)
            x_ours = inputs[0].clone().requires_grad_(grad_input)
            step(reference, x_plain, seed, plain_run)
            if seed == 2:
                peak = storage_peak(lambda: step(ours, x_ours, seed, remat_run))
                # The input x_0, live before the step, counts against the budget too.
                assert peak is None or peak + tensor_bytes(x_ours) <= budget, (fraction, budget, peak, solution.sequence)
            else:
                step(ours, x_ours, seed, remat_run)
            if grad_input:
                assert torch.equal(x_plain.grad, x_ours.grad)
            assert_same_training(reference, ours_model)
    return chk


@pytest.mark.parametrize("name,make,shape", [
    ("resnet18", resnet18_chain, (2, 3, 64, 64)),
    ("densenet121", densenet121_chain, (2, 3, 32, 32)),
    ("inception_v3", inception_v3_chain, (2, 3, 75, 75)),
])
def test_torchvision_models_train_as_plain_bit_for_bit(name, make, shape):
    torch.manual_seed(1)
    x = torch.randn(*shape)
    # The chain computes what torchvision's model does.
    chain, model = make()
    randomize(model)
    chain.eval()
    model.eval()
    with torch.no_grad():
        assert torch.equal(plain_forward(chain, (x,)), model(x))
    chk = check_training(lambda: make()[0], (x,))
    assert len(chk.chain.stage_names) >= 10


def test_transformer_with_token_ids_and_a_mask_trains_as_plain_bit_for_bit():
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (4, 24))
    mask = nn.Transformer.generate_square_subsequent_mask(24)
    check_training(transformer_chain, (ids,), context=(mask,), fractions=("least", 0.5, 0.8))


def test_autocast_recomputes_in_the_forward_precision():
    """The forward runs under torch.autocast (bfloat16 on the CPU), the backward outside it: the
    recomputations run in bfloat16 too."""
    check_autocast_training("cpu", torch.bfloat16)
