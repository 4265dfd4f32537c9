"""Reference outputs from torchvision for the C++ ports (tests/models/torchvision_test.cpp).

Usage: /usr/bin/python3 make_torchvision_reference.py OUT_DIR

For each model: <name>.pth, a randomly initialized torchvision model's state dict saved as
torchvision publishes weights (torch.save(model.state_dict(), ...)); <name>_io.pth, an input
and the model's eval-mode output. For resnet18 also a training step (output, gradient of the
input and of fc.weight, bn1's running mean after it) and for Inception v3 the training-mode
logits and auxiliary logits at 299x299 (dropout 0, so that both sides are deterministic).

Vision transformers: vit_small.pth and vit_small_io.pth for a small VisionTransformer (2
blocks, width 64, 32x32 images in 8x8 patches) whose every parameter is randomized first
(torchvision zeroes the head and sets every LayerNorm to 1 and 0, which would hide a weight
loaded into the wrong place), with a training step's gradients; and vit_names.txt, the name
and shape of every tensor of vit_b_16, vit_b_32 and vit_l_16 ("vit_b_16 conv_proj.weight
768,3,16,16"), so that the ports' names can be checked against the full models without saving
their weights.
"""
import os
import sys

import torch
import torchvision

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(0)
models = torchvision.models
cases = [
    ("resnet18", lambda: models.resnet18(weights=None), 64),
    ("resnet50", lambda: models.resnet50(weights=None), 64),
    ("vgg11_bn", lambda: models.vgg11_bn(weights=None), 64),
    ("densenet121", lambda: models.densenet121(weights=None), 64),
    ("inception_v3", lambda: models.inception_v3(weights=None, aux_logits=True,
                                                 init_weights=True, dropout=0.0), 139),
    # Without the auxiliary head (its weights absent from the file), with the input transform.
    ("inception_v3_transform", lambda: models.inception_v3(weights=None, aux_logits=False,
                                                           init_weights=True,
                                                           transform_input=True), 75),
]
for name, make, image in cases:
    model = make()
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
    print(name, "saved", flush=True)


def randomize(model):
    """Every parameter and buffer to distinct random values: norms' scales around 1."""
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("weight") and t.dim() == 1:  # LayerNorm / BatchNorm scale
                t.uniform_(0.5, 1.5)
            else:
                t.normal_(0, 0.1)


from torchvision.models.vision_transformer import VisionTransformer  # noqa: E402

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
        model = getattr(models, name)(weights=None)
        for key, t in model.state_dict().items():
            names.write(f"{name} {key} {','.join(str(d) for d in t.shape)}\n")
        del model
print("vision transformers saved", flush=True)
