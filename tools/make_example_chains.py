#!/usr/bin/env python3
"""Writes the example chains in examples/chains/ (synthetic, not measured).

Byte sizes follow torchvision's ResNet layer shapes at batch 32, 224x224, float32 (what each
stage keeps for its backward: convolution and BatchNorm outputs, max-pool indices); times are
FLOPs at an assumed 10 TFLOP/s, backward twice the forward, forward without autograd 5% faster.
`remat profile` (the profiler issue) replaces these with measured chains.
"""
import json
import sys

BATCH, FLOAT = 32, 4
TFLOPS = 10e12


def conv_flops(cin, cout, hw, k):
    return 2.0 * BATCH * cout * hw * hw * cin * k * k


def stage(name, flops, out, saved, bwd_tmp=0):
    fwd = flops / TFLOPS * 1e3
    return {"name": name, "fwd_ms": round(fwd, 4), "bwd_ms": round(2 * fwd, 4),
            "out_bytes": out, "saved_bytes": saved, "fwd_tmp_bytes": 0,
            "bwd_tmp_bytes": bwd_tmp, "fwd_nograd_ms": round(0.95 * fwd, 4)}


def act(c, hw):
    return BATCH * c * hw * hw * FLOAT


def resnet(depth):
    blocks = {18: [2, 2, 2, 2], 50: [3, 4, 6, 3], 152: [3, 8, 36, 3]}[depth]
    bottleneck = depth >= 50
    stages = [stage("conv1", conv_flops(3, 64, 112, 7), act(64, 112), 2 * act(64, 112))]
    stages.append(stage("maxpool", 9.0 * act(64, 56) / FLOAT, act(64, 56),
                        act(64, 56) + 2 * act(64, 56)))  # output + int64 indices
    cin, hw = 64, 56
    for layer, count in enumerate(blocks):
        width = 64 * 2 ** layer
        cout = width * 4 if bottleneck else width
        for b in range(count):
            stride = 2 if (b == 0 and layer > 0) else 1
            out_hw = hw // stride
            if bottleneck:
                flops = (conv_flops(cin, width, hw, 1) + conv_flops(width, width, out_hw, 3)
                         + conv_flops(width, cout, out_hw, 1))
                saved = 2 * act(width, hw) + 2 * act(width, out_hw) + 2 * act(cout, out_hw)
            else:
                flops = conv_flops(cin, width, out_hw, 3) + conv_flops(width, cout, out_hw, 3)
                saved = 4 * act(cout, out_hw)
            if b == 0 and (stride == 2 or cin != cout):
                flops += conv_flops(cin, cout, out_hw, 1)
                saved += 2 * act(cout, out_hw)
            saved += act(cout, out_hw)  # the block's output after the final ReLU
            stages.append(stage(f"layer{layer + 1}.{b}", flops, act(cout, out_hw), saved,
                                bwd_tmp=act(cout, out_hw)))
            cin, hw = cout, out_hw
    stages.append(stage("avgpool", 1.0 * act(cin, hw) / FLOAT, BATCH * cin * FLOAT,
                        BATCH * cin * FLOAT))
    stages.append(stage("fc", 2.0 * BATCH * cin * 1000, BATCH * 1000 * FLOAT,
                        BATCH * 1000 * FLOAT))
    return {"format": "remat-chain/1",
            "name": f"resnet{depth} b32 224 fp32 (synthetic: shapes, FLOPs at 10 TFLOP/s)",
            "input_bytes": act(3, 224), "stages": stages, "loss_tmp_bytes": 0}


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/chains"
    for depth in (18, 50, 152):
        with open(f"{out}/resnet{depth}-synthetic.json", "w") as f:
            json.dump(resnet(depth), f, indent=2)
            f.write("\n")
