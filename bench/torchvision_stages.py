"""torchvision networks split into the same stages as remat's C++ ports (models/src/*.cpp).

`stages(name)` builds `torchvision.models.<name>(weights=None)` and returns an
`nn.Sequential` of its own modules (the same parameter objects), one child per remat stage
and named as remat names it, together with the list of stage names:

- ResNet: "conv1" (conv1, bn1, relu), "maxpool", one stage per residual block
  ("layer1_0", ...), "fc" (avgpool, flatten, fc).
- VGG: one stage per convolution ("features_<i>": conv[, bn], relu) and per max pool
  ("features_<i>", i = index in torchvision's `features`), "avgpool" (avgpool, flatten),
  "classifier_0" (Linear, ReLU, Dropout), "classifier_3" (same), "classifier_6" (Linear).
- DenseNet: "conv0" (conv0, norm0, relu0, pool0), one stage per dense layer
  ("block<b>_layer<l>") returning cat(input, new features), "transition<b>", "classifier"
  (norm5, ReLU, adaptive average pool, flatten, classifier).
- Inception v3: "Conv2d_1a_3x3" (with the optional input transform), ..., "maxpool1",
  ..., "maxpool2", "Mixed_5b" ... "Mixed_6e", "AuxLogits" (only for "inception_v3"),
  "Mixed_7a", "Mixed_7b", "Mixed_7c", "fc" (avgpool, dropout, flatten, fc).
  "inception_v3" keeps the auxiliary classifier as remat does: in training mode the
  "AuxLogits" stage packs the auxiliary logits behind its input as zero-padded extra channel
  planes, the later stages carry them through, and the chain returns [logits | aux_logits]
  (N x 2K; `split_inception_output` separates them). It needs a 299x299 input in training
  mode. "inception_v3_noaux" is aux_logits=False (75x75 and up).

`python bench/torchvision_stages.py` checks every network against torchvision's own forward,
bit for bit, in eval mode and in train mode, and the parameter counts.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
VGGS = tuple(f"vgg{d}{bn}" for d in (11, 13, 16, 19) for bn in ("", "_bn"))
DENSENETS = ("densenet121", "densenet161", "densenet169", "densenet201")
INCEPTIONS = ("inception_v3", "inception_v3_noaux")
NAMES = RESNETS + VGGS + DENSENETS + INCEPTIONS


class DenseLayer(nn.Module):
    """A torchvision _DenseLayer as a chain stage: returns cat(input, new features)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        m = self.layer  # torchvision's bn_function and forward, on the concatenation x
        new = m.conv2(m.relu2(m.norm2(m.conv1(m.relu1(m.norm1(x))))))
        if m.drop_rate > 0:
            new = F.dropout(new, p=m.drop_rate, training=self.training)
        return torch.cat([x, new], 1)


class DenseHead(nn.Module):
    """features.norm5, then DenseNet.forward's ReLU, pooling, flatten and classifier."""

    def __init__(self, norm5: nn.Module, classifier: nn.Module) -> None:
        super().__init__()
        self.norm5, self.classifier = norm5, classifier

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm5(x), inplace=True)
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(out, (1, 1)), 1))


def pack_aux(x: Tensor, aux: Tensor | None) -> Tensor:
    """N x K logits behind x as ceil(K / (H W)) zero-padded channel planes (remat's pack_aux)."""
    if aux is None:
        return x
    plane = x.size(2) * x.size(3)
    planes = (aux.size(1) + plane - 1) // plane
    padded = F.pad(aux, (0, planes * plane - aux.size(1)))
    return torch.cat([x, padded.view(x.size(0), planes, x.size(2), x.size(3))], 1)


def unpack_aux(packed: Tensor, channels: int, classes: int) -> tuple[Tensor, Tensor | None]:
    """The inverse of pack_aux: (feature map with `channels` channels, logits or None)."""
    if packed.size(1) == channels:
        return packed, None
    if packed.size(1) < channels:
        raise RuntimeError(f"Inception v3: a stage expects {channels} channels, got {packed.size(1)}")
    aux = packed.narrow(1, channels, packed.size(1) - channels).flatten(1).narrow(1, 0, classes)
    return packed.narrow(1, 0, channels), aux


class InceptionStem(nn.Module):
    """Inception3._transform_input (when enabled), then Conv2d_1a_3x3."""

    def __init__(self, conv: nn.Module, transform_input: bool) -> None:
        super().__init__()
        self.conv, self.transform_input = conv, transform_input

    def forward(self, x: Tensor) -> Tensor:
        if self.transform_input:
            x_ch0 = torch.unsqueeze(x[:, 0], 1) * (0.229 / 0.5) + (0.485 - 0.5) / 0.5
            x_ch1 = torch.unsqueeze(x[:, 1], 1) * (0.224 / 0.5) + (0.456 - 0.5) / 0.5
            x_ch2 = torch.unsqueeze(x[:, 2], 1) * (0.225 / 0.5) + (0.406 - 0.5) / 0.5
            x = torch.cat((x_ch0, x_ch1, x_ch2), 1)
        return self.conv(x)


class CarryAux(nn.Module):
    """A Mixed block (7a, 7b, 7c) that carries packed auxiliary logits past itself."""

    def __init__(self, block: nn.Module, channels: int, classes: int) -> None:
        super().__init__()
        self.block, self.channels, self.classes = block, channels, classes

    def forward(self, packed: Tensor) -> Tensor:
        x, aux = unpack_aux(packed, self.channels, self.classes)
        return pack_aux(self.block(x), aux)


class AuxStage(nn.Module):
    """AuxLogits: in training mode packs the auxiliary logits behind its input; else identity."""

    def __init__(self, aux: nn.Module) -> None:
        super().__init__()
        self.aux = aux

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return x
        if x.size(2) < 17 or x.size(3) < 17:
            raise RuntimeError(
                "Inception v3's auxiliary classifier needs Mixed_6e's output to be at least 17x17 "
                f"(a 299x299 input), got {x.size(2)}x{x.size(3)}; use inception_v3_noaux")
        return pack_aux(x, self.aux(x))


class InceptionHead(nn.Module):
    """avgpool, dropout, flatten, fc; returns [logits | aux_logits] when the input carries them."""

    def __init__(self, avgpool: nn.Module, dropout: nn.Module, fc: nn.Linear) -> None:
        super().__init__()
        self.avgpool, self.dropout, self.fc = avgpool, dropout, fc

    def forward(self, packed: Tensor) -> Tensor:
        x, aux = unpack_aux(packed, self.fc.in_features, self.fc.out_features)
        logits = self.fc(torch.flatten(self.dropout(self.avgpool(x)), 1))
        return logits if aux is None else torch.cat([logits, aux], 1)


def split_inception_output(out: Tensor, classes: int) -> tuple[Tensor, Tensor | None]:
    """(logits, aux_logits or None) from a chain output of N x K or N x 2K."""
    return (out, None) if out.size(1) == classes else (out[:, :classes], out[:, classes:])


def torchvision_model(name: str, num_classes: int = 1000) -> nn.Module:
    """torchvision.models.<name>(weights=None); "inception_v3_noaux" is aux_logits=False."""
    if name not in NAMES:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(NAMES)})")
    if name in INCEPTIONS:
        return torchvision.models.inception_v3(
            weights=None, num_classes=num_classes, aux_logits=name == "inception_v3", init_weights=True)
    return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)


def chain_of(model: nn.Module, name: str) -> nn.Sequential:
    """The stages of the torchvision `model` (built by torchvision_model(name)), sharing its modules."""
    s: list[tuple[str, nn.Module]] = []
    if name in RESNETS:
        s += [("conv1", nn.Sequential(model.conv1, model.bn1, model.relu)), ("maxpool", model.maxpool)]
        for i in range(1, 5):
            s += [(f"layer{i}_{b}", block) for b, block in enumerate(getattr(model, f"layer{i}"))]
        s.append(("fc", nn.Sequential(model.avgpool, nn.Flatten(), model.fc)))
    elif name in VGGS:
        layers, i = list(model.features), 0
        while i < len(layers):
            if isinstance(layers[i], nn.MaxPool2d):
                s.append((f"features_{i}", layers[i]))
                i += 1
            else:  # conv[, bn], relu
                end = i + (3 if isinstance(layers[i + 1], nn.BatchNorm2d) else 2)
                s.append((f"features_{i}", nn.Sequential(*layers[i:end])))
                i = end
        c = model.classifier
        s += [("avgpool", nn.Sequential(model.avgpool, nn.Flatten())),
              ("classifier_0", nn.Sequential(c[0], c[1], c[2])),
              ("classifier_3", nn.Sequential(c[3], c[4], c[5])),
              ("classifier_6", c[6])]
    elif name in DENSENETS:
        f = model.features
        s.append(("conv0", nn.Sequential(f.conv0, f.norm0, f.relu0, f.pool0)))
        for child_name, child in f.named_children():
            if child_name.startswith("denseblock"):
                b = child_name[len("denseblock"):]
                s += [(f"block{b}_layer{ln[len('denselayer'):]}", DenseLayer(layer))
                      for ln, layer in child.named_children()]
            elif child_name.startswith("transition"):
                s.append((child_name, child))
        s.append(("classifier", DenseHead(f.norm5, model.classifier)))
    else:  # Inception v3
        classes = model.fc.out_features
        s.append(("Conv2d_1a_3x3", InceptionStem(model.Conv2d_1a_3x3, model.transform_input)))
        s += [(n, getattr(model, n)) for n in (
            "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1", "Conv2d_4a_3x3", "maxpool2",
            "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e")]
        if model.AuxLogits is not None:
            s.append(("AuxLogits", AuxStage(model.AuxLogits)))
        s += [("Mixed_7a", CarryAux(model.Mixed_7a, 768, classes)),
              ("Mixed_7b", CarryAux(model.Mixed_7b, 1280, classes)),
              ("Mixed_7c", CarryAux(model.Mixed_7c, 2048, classes)),
              ("fc", InceptionHead(model.avgpool, model.dropout, model.fc))]
    return nn.Sequential(OrderedDict(s))


def stages(name: str, num_classes: int = 1000) -> tuple[nn.Sequential, list[str]]:
    """torchvision's `name` split into remat's stages: (the chain, its stage names)."""
    seq = chain_of(torchvision_model(name, num_classes), name)
    return seq, [n for n, _ in seq.named_children()]


def parameter_count(module: nn.Module) -> int:
    """The number of parameter elements (shared parameters counted once)."""
    return sum(p.numel() for p in module.parameters())


def _outputs(out: Tensor | tuple, classes: int) -> list[Tensor]:
    """torchvision's output (a tensor or InceptionOutputs) or a chain's, as [logits(, aux)]."""
    if isinstance(out, Tensor):
        return [t for t in split_inception_output(out, classes) if t is not None]
    return [t for t in out if t is not None]


# remat's figures at 1000 classes (tests/models/models_test.cpp): parameters, stages.
REMAT_PARAMETERS = {
    "resnet18": 11689512, "resnet34": 21797672, "resnet50": 25557032, "resnet101": 44549160,
    "resnet152": 60192808, "vgg11": 132863336, "vgg11_bn": 132868840, "vgg13": 133047848,
    "vgg13_bn": 133053736, "vgg16": 138357544, "vgg16_bn": 138365992, "vgg19": 143667240,
    "vgg19_bn": 143678248, "densenet121": 7978856, "densenet161": 28681000,
    "densenet169": 14149480, "densenet201": 20013928, "inception_v3": 27161264,
    "inception_v3_noaux": 23834568}
REMAT_STAGES = {"resnet18": 11, "resnet50": 19, "resnet152": 53, "vgg16": 22, "densenet121": 63,
                "inception_v3": 20, "inception_v3_noaux": 19}


def _check(name: str, size: int, classes: int = 1000) -> tuple[bool, str]:
    """Compares the chain with torchvision's model (eval and train outputs, parameter count)
    and with remat's figures (parameter and stage counts)."""
    torch.manual_seed(0)
    model = torchvision_model(name, classes)
    seq = chain_of(model, name)
    x = torch.randn(2, 3, size, size)
    problems = []
    if parameter_count(seq) != parameter_count(model):
        problems.append(f"parameters {parameter_count(seq)} != {parameter_count(model)}")
    if parameter_count(seq) != REMAT_PARAMETERS[name]:
        problems.append(f"parameters {parameter_count(seq)} != remat's {REMAT_PARAMETERS[name]}")
    if len(seq) != REMAT_STAGES.get(name, len(seq)):
        problems.append(f"{len(seq)} stages != remat's {REMAT_STAGES[name]}")
    for train in (False, True):
        model.train(train)  # seq shares the modules; set both all the same
        seq.train(train)
        with torch.no_grad():
            torch.manual_seed(1)
            want = _outputs(model(x), classes)
            torch.manual_seed(1)
            got = _outputs(seq(x), classes)
        mode = "train" if train else "eval"
        if len(want) != len(got) or any(not torch.equal(w, g) for w, g in zip(want, got)):
            problems.append(f"{mode} outputs differ")
    detail = f"{len(seq)} stages, {parameter_count(seq):,} parameters"
    return not problems, "; ".join([detail] + problems)


def main() -> int:
    """Checks every supported network; exit status 1 on any mismatch."""
    sizes = {**{n: 32 for n in VGGS}, "inception_v3": 299, "inception_v3_noaux": 75}
    failures = 0
    for name in NAMES:
        start = time.perf_counter()
        ok, detail = _check(name, sizes.get(name, 64))
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:<20} {detail} ({time.perf_counter() - start:.1f} s)",
              flush=True)
    print(f"{len(NAMES) - failures}/{len(NAMES)} networks match torchvision bit for bit")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
