"""Reference outputs from torchvision for the C++ ports (tests/models/torchvision_test.cpp).

Usage: python3 make_torchvision_reference.py OUT_DIR

Every parameter and buffer of each reference model is randomized first (randomize below).
Freshly initialized, torchvision sets every BatchNorm to weight 1, bias 0, mean 0 and variance
1, zeroes biases and ViT's head, and sets every LayerNorm to 1 and 0: a weight loaded into the
wrong layer would then give the same output.

The 19 convolutional ports, with 10 classes (cases.txt lists them with their input sizes); the
VGGs with a classifier 64 wide instead of 4096 (its layers and names unchanged), so that their
files are not 500 MB each:
- <name>.pth, the model's state dict saved as torchvision publishes weights
  (torch.save(model.state_dict(), ...));
- <name>_io.pth, an input and the model's eval-mode output;
- for resnet18 also a training step (output, gradient of the input and of fc.weight, bn1's
  running mean after it), and for Inception v3 the training-mode logits and auxiliary logits
  at 299x299 (dropout 0, so that both sides are deterministic);
- cnn_names.txt, the name and shape of every tensor of the full-size models (1000 classes,
  the VGGs 4096 wide): "resnet18 conv1.weight 64,3,7,7".
Plus inception_v3_transform: Inception v3 without the auxiliary head (its weights absent from
the file), with the input transform.

Vision transformers: vit_small.pth and vit_small_io.pth for a small VisionTransformer (2
blocks, width 64, 32x32 images in 8x8 patches) with a training step's gradients; and
vit_names.txt, the name and shape of every tensor of vit_b_16, vit_b_32 and vit_l_16.

versions.txt records the torch and torchvision that wrote the files; the build writes them
again when either changes (tests/CMakeLists.txt).
"""
import contextlib
import os
import sys

import torch
import torchvision
from torch import nn
from torchvision.models import resnet as tv_resnet
from torchvision.models import vgg as tv_vgg
from torchvision.models.vision_transformer import VisionTransformer

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(0)
models = torchvision.models


def randomize(model):
    """Every parameter and buffer to distinct random values of a sensible scale."""
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point():  # BatchNorm's num_batches_tracked
                t.random_(0, 1000)
            elif name.endswith("running_var") or (name.endswith("weight") and t.dim() == 1):
                t.uniform_(0.5, 1.5)  # a variance, a norm's scale
            elif t.dim() > 1 and name.endswith("weight"):
                # He's scale, so that deep ReLU networks' outputs stay of order 1.
                t.normal_(0, (2.0 / t[0].numel()) ** 0.5)
            else:  # biases, running means, ViT's position embedding and class token
                t.normal_(0, 0.1)


@contextlib.contextmanager
def uninitialized():
    """torch.nn.init's functions (kaiming_uniform_, normal_, trunc_normal_, ...) as no-ops while
    models are built: every value of a compared model is written by randomize() afterwards, and
    of the full-size models only the names and shapes are read. Initializing them took two
    thirds of this script's time (the full-size VGGs' 100-million-weight classifiers)."""
    saved = {name: f for name, f in vars(torch.nn.init).items()
             if name.endswith("_") and not name.startswith("_") and callable(f)}
    for name in saved:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, f in saved.items():
            setattr(torch.nn.init, name, f)


def damp_residuals(model):
    """ResNets: each residual branch's last BatchNorm scaled by 0.1 to 0.3. In eval mode with
    random statistics, every block would otherwise about double the variance of what it adds
    to (resnet152's logits reached 1e11)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (tv_resnet.BasicBlock, tv_resnet.Bottleneck)):
                last = m.bn3 if isinstance(m, tv_resnet.Bottleneck) else m.bn2
                last.weight.uniform_(0.1, 0.3)


def vgg(config, batch_norm):
    """torchvision's VGG (its features; its classifier's layers, 64 wide), 10 classes."""
    def make():
        model = tv_vgg.VGG(tv_vgg.make_layers(tv_vgg.cfgs[config], batch_norm=batch_norm),
                           num_classes=10)
        model.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 64), nn.ReLU(True), nn.Dropout(),
                                         nn.Linear(64, 64), nn.ReLU(True), nn.Dropout(),
                                         nn.Linear(64, 10))
        return model
    return make


def named(name, **kwargs):
    return lambda: getattr(models, name)(weights=None, **kwargs)


# (name, the model compared, the full-size model whose names are listed, image size)
cases = []
for depth in (18, 34, 50, 101, 152):
    name = f"resnet{depth}"
    cases.append((name, named(name, num_classes=10), named(name), 64))
for depth, config in ((11, "A"), (13, "B"), (16, "D"), (19, "E")):
    for bn in (False, True):
        name = f"vgg{depth}" + ("_bn" if bn else "")
        cases.append((name, vgg(config, bn), named(name), 32))
cases.append(("inception_v3",
              named("inception_v3", aux_logits=True, init_weights=True, dropout=0.0,
                    num_classes=10),
              named("inception_v3", aux_logits=True, init_weights=True), 139))
cases.append(("inception_v3_noaux",
              named("inception_v3", aux_logits=False, init_weights=True, num_classes=10),
              named("inception_v3", aux_logits=False, init_weights=True), 75))
for depth in (121, 161, 169, 201):
    name = f"densenet{depth}"
    cases.append((name, named(name, num_classes=10), named(name), 64))
# No listing: its names are inception_v3_noaux's.
cases.append(("inception_v3_transform",
              named("inception_v3", aux_logits=False, init_weights=True, transform_input=True,
                    num_classes=10), None, 75))

with open(os.path.join(out_dir, "cases.txt"), "w") as listing:
    for name, _, _, image in cases:
        listing.write(f"{name} {image}\n")
with open(os.path.join(out_dir, "cnn_names.txt"), "w") as names:
    for name, make, make_full, image in cases:
        with uninitialized():
            model = make()
        randomize(model)
        damp_residuals(model)
        torch.save(model.state_dict(), os.path.join(out_dir, name + ".pth"))
        x = torch.randn(2, 3, image, image)
        model.eval()
        with torch.no_grad():
            io = {"input": x, "output": model(x)}
        model.train()
        if name == "resnet18":
            xt = x.clone().requires_grad_(True)
            out = model(xt)
            weight = torch.randn_like(out)
            (out * weight).sum().backward()
            io.update({"train_output": out.detach(), "loss_weight": weight,
                       "train_input_grad": xt.grad, "train_fc_weight_grad": model.fc.weight.grad,
                       "train_bn1_running_mean": model.bn1.running_mean.clone()})
        if name == "inception_v3":
            x299 = torch.randn(2, 3, 299, 299)
            with torch.no_grad():
                outputs = model(x299)
            io.update({"train_input": x299, "train_logits": outputs.logits,
                       "train_aux_logits": outputs.aux_logits})
        torch.save(io, os.path.join(out_dir, name + "_io.pth"))
        del model
        if make_full is not None:
            with uninitialized():
                full = make_full()
            for key, t in full.state_dict().items():
                names.write(f"{name} {key} {','.join(str(d) for d in t.shape)}\n")
            del full
        print(name, "saved", flush=True)

with uninitialized():
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64,
                            mlp_dim=128, num_classes=10)
randomize(vit)
torch.save(vit.state_dict(), os.path.join(out_dir, "vit_small.pth"))
x = torch.randn(3, 3, 32, 32)
vit.eval()
with torch.no_grad():
    io = {"input": x, "output": vit(x)}
vit.train()
xt = x.clone().requires_grad_(True)
out = vit(xt)
weight = torch.randn_like(out)
(out * weight).sum().backward()
io.update({"train_output": out.detach(), "loss_weight": weight, "train_input_grad": xt.grad,
           "train_conv_proj_weight_grad": vit.conv_proj.weight.grad,
           "train_pos_embedding_grad": vit.encoder.pos_embedding.grad})
torch.save(io, os.path.join(out_dir, "vit_small_io.pth"))
with open(os.path.join(out_dir, "vit_names.txt"), "w") as names:
    for name in ("vit_b_16", "vit_b_32", "vit_l_16"):
        with uninitialized():
            model = getattr(models, name)(weights=None)
        for key, t in model.state_dict().items():
            names.write(f"{name} {key} {','.join(str(d) for d in t.shape)}\n")
        del model
print("vision transformers saved", flush=True)

with open(os.path.join(out_dir, "versions.txt"), "w") as versions:
    versions.write(f"torch {torch.__version__} torchvision {torchvision.__version__}\n")
