"""Reference files from Hugging Face transformers' GPT-2 for the C++ port (tests/models/gpt2_test.cpp).

Usage: python make_transformers_reference.py OUT_DIR   (a Python with torch and transformers)

A small GPT2LMHeadModel (2 blocks, width 64, 4 heads, 32 positions, 101 tokens, no dropout)
whose every parameter is randomized first (Hugging Face sets LayerNorms to 1 and 0 and biases to
0, which would hide a weight loaded into the wrong place), saved three ways:
- gpt2_small.safetensors: save_pretrained's model.safetensors (the tied lm_head.weight left out);
- gpt2_small.bin: torch.save(model.state_dict()), GPT2LMHeadModel's names, lm_head.weight too;
- gpt2_small_base.bin: the published "gpt2" files' form, GPT2Model's names ("h.0.attn.c_attn.weight",
  no "transformer.") with the causal-mask buffers older versions saved ("h.0.attn.bias").
gpt2_small_io.pth: token ids, the eval-mode logits, the loss with labels=ids, and after a
training step on that loss the gradients of wte and of the first block's c_fc.
gpt2_names.txt: the name and shape of every tensor of the 124M configuration's state dict.
"""
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(0)

config = transformers.GPT2Config(vocab_size=101, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                 bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(config)
with torch.no_grad():
    for name, t in model.named_parameters():
        if name.endswith("weight") and t.dim() == 1:  # LayerNorm scales
            t.uniform_(0.5, 1.5)
        else:
            t.normal_(0, 0.1)

state = {k: v.contiguous() for k, v in model.state_dict().items()}
torch.save(state, os.path.join(out_dir, "gpt2_small.bin"))
save_file({k: v for k, v in state.items() if k != "lm_head.weight"},
          os.path.join(out_dir, "gpt2_small.safetensors"), metadata={"format": "pt"})
base = {k[len("transformer."):]: v for k, v in state.items() if k.startswith("transformer.")}
for i in range(config.n_layer):
    mask = torch.tril(torch.ones(config.n_positions, config.n_positions, dtype=torch.uint8))
    base[f"h.{i}.attn.bias"] = mask.view(1, 1, config.n_positions, config.n_positions)
    base[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
torch.save(base, os.path.join(out_dir, "gpt2_small_base.bin"))

ids = torch.randint(config.vocab_size, (3, 20))
model.eval()
with torch.no_grad():
    logits = model(ids).logits
    loss = model(ids, labels=ids).loss
model.train()
model.zero_grad()
train_loss = model(ids, labels=ids).loss
train_loss.backward()
io = {"ids": ids, "logits": logits, "loss": loss, "train_loss": train_loss.detach(),
      "wte_grad": model.transformer.wte.weight.grad,
      "c_fc_grad": model.transformer.h[0].mlp.c_fc.weight.grad}
torch.save(io, os.path.join(out_dir, "gpt2_small_io.pth"))

with open(os.path.join(out_dir, "gpt2_names.txt"), "w") as names:
    full = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    for key, t in full.state_dict().items():
        names.write(f"gpt2 {key} {','.join(str(d) for d in t.shape)}\n")
print("GPT-2 references saved with transformers", transformers.__version__, flush=True)
