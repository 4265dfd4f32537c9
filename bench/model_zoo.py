"""The models remat trains as they come (issue "Any model"), at sizes for a benchmark run.

`build(name, size)` returns a `Model`: the module, randomly initialized after
torch.manual_seed(0) from a config (nothing is downloaded), a sample batch, the training
step's loss, and which competitors apply. `size` is "cpu" (small inputs and configs, for a
two-core machine), "gpu" (the published widths, larger batches) or "tiny" (a smoke test:
two layers, 32x32 images).

- torchvision, as `torchvision.models.<name>(num_classes=...)` builds them: resnet50,
  densenet121, inception_v3 (with its auxiliary classifier: 299x299 inputs), vit_b_16
  (`image_size` set for the input), convnext_tiny, efficientnet_b0, mobilenet_v3_large.
- Hugging Face transformers, with labels and the model's own loss: gpt2 (GPT2LMHeadModel,
  12 layers), llama (LlamaForCausalLM; at size "gpu" Llama 3.2 1B's shape in bf16), bert (BertForMaskedLM), t5
  (T5ForConditionalGeneration).
- timm: timm_vit (vit_small_patch16_224), timm_convnext (convnext_tiny).
- unet: a U-Net with long skips, BatchNorm, in-place ReLU and dropout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

TORCHVISION = ["resnet50", "densenet121", "inception_v3", "vit_b_16", "convnext_tiny",
               "efficientnet_b0", "mobilenet_v3_large"]
HUGGING_FACE = ["gpt2", "llama", "bert", "t5"]
TIMM = ["timm_vit", "timm_convnext"]
ALL = TORCHVISION + HUGGING_FACE + TIMM + ["unet"]


@dataclass
class Model:
    name: str
    module: nn.Module
    sample: Any  # a tensor, or a dict of keyword arguments
    loss: Callable[[Any], torch.Tensor]  # the loss of the model's output
    hugging_face: bool = False
    description: str = ""
    extra: dict = field(default_factory=dict)

    def call(self, module: nn.Module) -> Any:
        return module(**self.sample) if isinstance(self.sample, dict) else module(self.sample)


class UNet(nn.Module):
    """A U-Net: long skips from each level down to the same level up, BatchNorm, in-place ReLU
    and dropout."""

    def __init__(self, channels=(32, 64, 128, 256)):
        super().__init__()

        def block(c_in, c_out):
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out),
                                 nn.ReLU(inplace=True), nn.Conv2d(c_out, c_out, 3, padding=1),
                                 nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))

        self.down = nn.ModuleList()
        c_in = 3
        for c in channels:
            self.down.append(block(c_in, c))
            c_in = c
        self.up = nn.ModuleList()
        for c in reversed(channels[:-1]):
            self.up.append(block(c_in + c, c))
            c_in = c
        self.drop = nn.Dropout2d(0.1)
        self.head = nn.Conv2d(c_in, 2, 1)

    def forward(self, x):
        skips = []
        for k, block in enumerate(self.down):
            x = block(x)
            if k < len(self.down) - 1:
                skips.append(x)
                x = F.max_pool2d(x, 2)
        for block in self.up:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            x = block(torch.cat([x, skips.pop()], dim=1))
        return self.head(self.drop(x))


def _classification(out: Any, target: torch.Tensor) -> torch.Tensor:
    if isinstance(out, tuple):  # torchvision's InceptionOutputs: logits and auxiliary logits
        return F.cross_entropy(out[0], target) + 0.4 * F.cross_entropy(out[1], target)
    return F.cross_entropy(out, target)


def _hugging_face(name: str, gpu: bool, tiny: bool = False) -> tuple[nn.Module, dict, str]:
    import transformers

    vocab, seq, batch = (50257, 1024, 4) if gpu else (96, 16, 2) if tiny else (512, 128, 4)
    torch.manual_seed(0)
    ids = torch.randint(vocab, (batch, seq))
    batch_dict = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    width = 768 if gpu else 32 if tiny else 128
    layers = 2 if tiny else 12
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=12 if gpu else 4,
                                         vocab_size=vocab, n_positions=seq)
        model = transformers.GPT2LMHeadModel(config)
    elif name == "llama" and gpu:
        # Llama 3.2 1B's shape (1.24 billion parameters, tied embeddings), in bf16, batch 8.
        batch = 8
        ids = torch.randint(128256, (batch, seq))
        batch_dict = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        config = transformers.LlamaConfig(num_hidden_layers=16, hidden_size=2048,
                                          num_attention_heads=32, num_key_value_heads=8,
                                          intermediate_size=8192, vocab_size=128256,
                                          max_position_embeddings=seq, tie_word_embeddings=True)
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        return model, batch_dict, (f"batch {batch}, sequence {seq}, width 2048, 16 layers, "
                                   f"LlamaForCausalLM, bf16")
    elif name == "llama":
        config = transformers.LlamaConfig(num_hidden_layers=2 if tiny else 8, hidden_size=width,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=4 * width, vocab_size=vocab,
                                          max_position_embeddings=seq)
        model = transformers.LlamaForCausalLM(config)
    elif name == "bert":
        config = transformers.BertConfig(num_hidden_layers=layers, hidden_size=width,
                                         num_attention_heads=12 if gpu else 4,
                                         intermediate_size=4 * width, vocab_size=vocab,
                                         max_position_embeddings=max(512, seq))
        model = transformers.BertForMaskedLM(config)
    elif name == "t5":
        config = transformers.T5Config(vocab_size=vocab, d_model=width, d_kv=64 if gpu else 32,
                                       d_ff=4 * width, num_layers=layers // 2, num_decoder_layers=layers // 2,
                                       num_heads=12 if gpu else 4, decoder_start_token_id=0)
        model = transformers.T5ForConditionalGeneration(config)
        batch_dict["labels"] = torch.randint(vocab, (batch, seq // 2))
    else:
        raise ValueError(name)
    return model, batch_dict, f"batch {batch}, sequence {seq}, width {width}, {type(model).__name__}"


def build(name: str, size: str = "cpu", device: str | torch.device = "cpu") -> Model:
    """The model `name` (one of ALL) at `size` ("cpu" or "gpu"), with its batch, on `device`."""
    if size not in ("cpu", "gpu", "tiny"):
        raise ValueError(f"size {size!r}: cpu, gpu or tiny")
    gpu, tiny = size == "gpu", size == "tiny"
    torch.manual_seed(0)
    if name in HUGGING_FACE:
        module, batch, description = _hugging_face(name, gpu, tiny)
        return Model(name, module.to(device), {k: v.to(device) for k, v in batch.items()},
                     lambda out: out.loss, hugging_face=True, description=description)
    classes = 1000 if gpu else 10
    batch = 32 if gpu else 2 if tiny else 4
    image = 224 if gpu else 32 if tiny else 64
    if name in TORCHVISION:
        import torchvision

        kwargs: dict = {"num_classes": classes}
        if name == "inception_v3":
            image = 299  # the auxiliary classifier needs it
            batch = 32 if gpu else 2  # training BatchNorm needs 2 in the auxiliary branch
            kwargs.update(aux_logits=True, init_weights=True)
        if name == "vit_b_16":
            kwargs["image_size"] = image
        module = getattr(torchvision.models, name)(**kwargs)
    elif name == "timm_vit":
        import timm

        module = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=image,
                                   num_classes=classes)
    elif name == "timm_convnext":
        import timm

        module = timm.create_model("convnext_tiny", pretrained=False, num_classes=classes)
    elif name == "unet":
        image = 256 if gpu else 16 if tiny else 64
        module = UNet((4, 8) if tiny else (32, 64, 128, 256))
    else:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(ALL)}")
    module.to(device)
    x = torch.randn(batch, 3, image, image, device=device)
    if name == "unet":
        target = torch.randn(batch, 2, image, image, device=device)
        return Model(name, module, x, lambda out: F.mse_loss(out, target),
                     description=f"batch {batch}, {image}x{image}")
    target = torch.randint(classes, (batch,), device=device)
    return Model(name, module, x, lambda out: _classification(out, target),
                 description=f"batch {batch}, {image}x{image}, {classes} classes",
                 extra={"classes": classes})


# The block each model is made of, as its authors checkpoint it (Hugging Face's
# GradientCheckpointingLayers) or as its paper names it; absent: model_zoo.blocks' rule.
BLOCKS = {"resnet50": ("Bottleneck",), "densenet121": ("_DenseLayer", "_Transition"),
          "vit_b_16": ("EncoderBlock",), "convnext_tiny": ("CNBlock",),
          "efficientnet_b0": ("MBConv",), "mobilenet_v3_large": ("InvertedResidual",),
          "gpt2": ("GPT2Block",), "llama": ("LlamaDecoderLayer",), "bert": ("BertLayer",),
          "t5": ("T5Block",), "timm_vit": ("Block",), "timm_convnext": ("ConvNeXtBlock",)}


def blocks(model: nn.Module, classes: tuple = ()) -> list[tuple[str, nn.Module]]:
    """The model's building blocks, for a per-block checkpointing policy: the outermost
    modules whose class is named in `classes`; without `classes`, each module that lies
    within no other block and is either an item of an nn.ModuleList or nn.ModuleDict (the
    U-Net's levels), or not a leaf nor a plain container and of a class that occurs at least
    twice in the model (inception_v3's InceptionA, C and E, and the BasicConv2d elsewhere)."""
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    counts: dict = {}
    for m in model.modules():
        counts[type(m)] = counts.get(type(m), 0) + 1

    def is_block(m: nn.Module, listed: bool) -> bool:
        if classes:
            return type(m).__name__ in classes
        has_children = any(True for _ in m.children())
        return has_children and (listed or (type(m) not in containers and counts[type(m)] >= 2))

    found: list = []

    def walk(prefix: str, m: nn.Module) -> None:
        listed = type(m) in (nn.ModuleList, nn.ModuleDict)
        for name, child in m.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if is_block(child, listed):
                found.append((path, child))
            else:
                walk(path, child)

    walk("", model)
    return found
