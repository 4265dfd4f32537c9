"""A survey of models as they come: 106 of timm's, Hugging Face's and torchvision's, at small
sizes on the CPU, each given whole to remat.Checkpointable and trained at halfway between its
least budget and store-all, two SGD steps against the same model run eagerly.

    python tools/model_sweep.py                  # all: hf hfv timm tv (about 8 minutes, 2 cores)
    python tools/model_sweep.py timm tv          # some families
    python tools/model_sweep.py timm:test_maxvit # one model

One JSON line per model: its stages, store-all and least bytes, whether the losses, every
gradient and every parameter and buffer after the steps are equal bit for bit (the count that
differ, and the largest gradient difference), the measured step peak against the prediction
(KiB; the caller's scalars counted as in tests/python), the operations of that step whose
memory, traced, went above their prediction (their count, the largest excess, the first), or
the error and where it was raised.
A survey, not a test: tests/python/test_models_as_they_come.py holds what must pass.
"""

import copy
import json
import os
import sys
import time
import traceback

import torch
from torch import nn

import remat

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "python")
)
from conftest import step_peak, weighted_loss  # noqa: E402
from test_models_as_they_come import _train as train  # noqa: E402  (two SGD steps)

torch.set_num_threads(1)


def tiny_hf(name):
    import transformers as T

    common = dict(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    cfgs = {
        "mistral": ("MistralForCausalLM", "MistralConfig", dict(num_key_value_heads=2)),
        "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(num_key_value_heads=2)),
        "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(num_key_value_heads=2, head_dim=8)),
        "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(num_key_value_heads=2, head_dim=8)),
        "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(num_key_value_heads=2, head_dim=8)),
        "phi": ("PhiForCausalLM", "PhiConfig", {}),
        "phi3": (
            "Phi3ForCausalLM",
            "Phi3Config",
            dict(num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=2),
        ),
        "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", {}),
        "falcon": ("FalconForCausalLM", "FalconConfig", {}),
        "opt": ("OPTForCausalLM", "OPTConfig", dict(ffn_dim=64, word_embed_proj_dim=32)),
        "bloom": ("BloomForCausalLM", "BloomConfig", dict(n_layer=2, n_head=4)),
        "gptj": (
            "GPTJForCausalLM",
            "GPTJConfig",
            dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64),
        ),
        "gpt_neo": (
            "GPTNeoForCausalLM",
            "GPTNeoConfig",
            dict(attention_types=[[["global", "local"], 1]], window_size=8),
        ),
        "roberta": ("RobertaForMaskedLM", "RobertaConfig", dict(pad_token_id=1)),
        "distilbert": (
            "DistilBertForMaskedLM",
            "DistilBertConfig",
            dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64),
        ),
        "albert": ("AlbertForMaskedLM", "AlbertConfig", dict(embedding_size=16)),
        "electra": ("ElectraForMaskedLM", "ElectraConfig", dict(embedding_size=16)),
        "deberta_v2": ("DebertaV2ForMaskedLM", "DebertaV2Config", {}),
        "bart": (
            "BartForConditionalGeneration",
            "BartConfig",
            dict(
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
            ),
        ),
        "mixtral": (
            "MixtralForCausalLM",
            "MixtralConfig",
            dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        ),
        "olmo": ("OlmoForCausalLM", "OlmoConfig", dict(num_key_value_heads=2)),
        "stablelm": ("StableLmForCausalLM", "StableLmConfig", dict(num_key_value_heads=2)),
    }
    model_cls, cfg_cls, extra = cfgs[name]
    kw = dict(common)
    kw.update(extra)
    cfg = getattr(T, cfg_cls)(**kw)
    model = getattr(T, model_cls)(cfg)
    torch.manual_seed(7)
    ids = torch.randint(4, 96, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids}
    if name == "bart":
        batch["labels"] = torch.randint(4, 96, (2, 8))
    return model, batch


def tiny_hf_vision(name):
    import transformers as T

    if name == "hf_vit":
        return T.ViTForImageClassification(
            T.ViTConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                image_size=32,
                patch_size=8,
                num_labels=5,
            )
        )
    if name == "hf_swin":
        return T.SwinForImageClassification(
            T.SwinConfig(
                image_size=32,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 2],
                window_size=4,
                num_labels=5,
            )
        )
    if name == "hf_convnext":
        return T.ConvNextForImageClassification(
            T.ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=5)
        )
    if name == "hf_resnet":
        return T.ResNetForImageClassification(
            T.ResNetConfig(
                embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_labels=5
            )
        )
    if name == "hf_segformer":
        return T.SegformerForSemanticSegmentation(
            T.SegformerConfig(
                hidden_sizes=[8, 16, 32, 64],
                decoder_hidden_size=32,
                num_labels=3,
                depths=[1, 1, 1, 1],
            )
        )
    raise KeyError(name)


TIMM = [
    "test_byobnet",
    "test_coatnet",
    "test_convnext",
    "test_convnext2",
    "test_convnext3",
    "test_efficientnet",
    "test_efficientnet_evos",
    "test_efficientnet_gn",
    "test_efficientnet_ln",
    "test_mambaout",
    "test_maxvit",
    "test_nfnet",
    "test_resnet",
    "test_vit",
    "test_vit2",
    "test_vit3",
    "test_vit4",
    "test_vit_relpos",
    "resnet18d",
    "regnetx_002",
    "mobilenetv3_small_050",
    "lcnet_050",
    "ghostnet_050",
    "repvgg_a0",
    "dla46_c",
    "mobilevit_xxs",
    "edgenext_xx_small",
    "efficientvit_b0",
    "fastvit_t8",
    "tiny_vit_5m_224",
    "levit_128s",
    "poolformerv2_s12",
    "densenet121",
    "res2net50_14w_8s",
    "skresnet18",
    "rexnet_100",
    "hrnet_w18_small",
    "cspdarknet53",
    "xception41",
    "selecsls42b",
    "hgnetv2_b0",
    "inception_next_atto",
    "mixer_s16_224",
    "deit_tiny_patch16_224",
    "swin_tiny_patch4_window7_224",
    "convmixer_768_32",
    "eva02_tiny_patch14_224",
    "pvt_v2_b0",
    "coat_lite_tiny",
    "crossvit_tiny_240",
    "gcvit_xxtiny",
    "nest_tiny",
    "twins_svt_small",
    "vovnet39a",
    "dpn48b",
    "tresnet_m",
    "mobileone_s0",
    "ese_vovnet19b_dw",
]
TIMM_SIZE = {
    "test_coatnet": 160,
    "test_maxvit": 160,
    "test_vit3": 160,
    "test_vit_relpos": 160,
    "mixer_s16_224": 224,
    "deit_tiny_patch16_224": 224,
    "swin_tiny_patch4_window7_224": 224,
    "eva02_tiny_patch14_224": 224,
    "levit_128s": 224,
    "crossvit_tiny_240": 240,
    "tiny_vit_5m_224": 224,
    "gcvit_xxtiny": 224,
    "nest_tiny": 224,
    "coat_lite_tiny": 224,
    "twins_svt_small": 224,
    "convmixer_768_32": 64,
    "xception41": 96,
    "efficientvit_b0": 64,
    "fastvit_t8": 64,
    "mobilevit_xxs": 64,
    "hrnet_w18_small": 64,
    "tresnet_m": 64,
}
TV = [
    "alexnet",
    "vgg11_bn",
    "resnet18",
    "resnext50_32x4d",
    "wide_resnet50_2",
    "squeezenet1_1",
    "densenet121",
    "googlenet",
    "inception_v3",
    "shufflenet_v2_x0_5",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "mnasnet0_5",
    "efficientnet_b0",
    "efficientnet_v2_s",
    "regnet_y_400mf",
    "vit_b_16",
    "swin_t",
    "swin_v2_t",
    "maxvit_t",
    "convnext_tiny",
]
TV_SIZE = {
    "alexnet": 64,
    "vgg11_bn": 32,
    "googlenet": 64,
    "inception_v3": 75,
    "vit_b_16": 224,
    "swin_t": 64,
    "swin_v2_t": 64,
    "maxvit_t": 224,
}
HF = [
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "phi",
    "phi3",
    "gpt_neox",
    "falcon",
    "opt",
    "bloom",
    "gptj",
    "gpt_neo",
    "roberta",
    "distilbert",
    "albert",
    "electra",
    "deberta_v2",
    "bart",
    "mixtral",
    "olmo",
    "stablelm",
]
HFV = ["hf_vit", "hf_swin", "hf_convnext", "hf_resnet", "hf_segformer"]


def make(family, name):
    torch.manual_seed(0)
    if family == "hf":
        model, batch = tiny_hf(name)

        def step(m):
            out = m(**batch)
            out.loss.backward()
            return out.loss

        return model, batch, step
    if family == "timm":
        import timm

        size = TIMM_SIZE.get(name, 32)
        model = timm.create_model(name, pretrained=False, num_classes=5)
        x = torch.randn(2, 3, size, size)
    elif family == "tv":
        import torchvision

        size = TV_SIZE.get(name, 32)
        kw = {}
        if name == "vit_b_16":
            kw = dict(image_size=32)
            size = 32
        if name in ("googlenet", "inception_v3"):
            kw = dict(aux_logits=False, init_weights=True)
        model = getattr(torchvision.models, name)(num_classes=5, **kw)
        x = torch.randn(2, 3, size, size)
    else:
        model = tiny_hf_vision(name)
        x = torch.randn(2, 3, 32, 32)

    def step(m):
        out = m(x)
        if hasattr(out, "logits"):
            out = out.logits
        loss = weighted_loss(out)
        loss.backward()
        return loss

    return model, x, step


def check(family, name):
    t0 = time.time()
    rec = {"model": f"{family}:{name}"}
    model, sample, step = make(family, name)
    rec["params"] = sum(p.numel() for p in model.parameters())
    model.train()
    plain = copy.deepcopy(model)
    chk = remat.Checkpointable(model, sample, progress=False, repeat=1)
    full, least = chk.store_all_peak(), chk.min_budget()
    rec.update(stages=len(chk.chain.stage_names), full=full, least=least)
    mid = (least + full) // 2
    sol = chk.compute_sequence(mid)
    rec["ok_mid"] = bool(sol.ok)
    ours, grads = train(chk, step)
    theirs, pgrads = train(plain, step)
    rec["loss_equal"] = all(torch.equal(a, b) for a, b in zip(ours, theirs))
    bad = [n for n in grads if not torch.equal(grads[n], pgrads.get(n, torch.empty(0)))]
    rec["grad_keys_equal"] = grads.keys() == pgrads.keys()
    rec["grads_unequal"] = len(bad)
    if bad:
        rec["max_grad_diff"] = max(
            float((grads[n] - pgrads[n]).abs().max()) for n in bad if n in pgrads
        )
    sd_bad = [
        n
        for (n, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items())
        if not torch.equal(a, b)
    ]
    rec["state_unequal"] = len(sd_bad)
    # The measured step peak at that budget against the prediction: the step's inputs are
    # allocated before it but counted, the seed of loss.backward() and the loss the step
    # returns are the caller's (tests/python/test_models_as_they_come.py, _assert_peaks).
    try:
        inputs = sum(
            t.untyped_storage().nbytes()
            for t in (sample.values() if isinstance(sample, dict) else [sample])
        )
        reserve = remat._C.runtime_reserve_bytes("cpu")
        chk.trace_next_step(memory=True)
        measured = step_peak(lambda: step(chk)) + inputs + reserve - 8
        rec["peak_vs_pred_kib"] = round((measured - sol.peak_bytes) / 1024, 2)
        rec["peak_over_budget"] = measured > mid
        # The operations whose memory, traced, went above its prediction (after the loss, the
        # caller's loss and seed aside) and the largest excess.
        trace = chk.last_trace
        loss = next(k for k, e in enumerate(trace) if e["kind"] == "loss")
        over = [
            max(e["measured_peak_bytes"] - e["predicted_peak_bytes"],
                e["measured_after_bytes"] - e["predicted_after_bytes"]) - (8 if k > loss else 0)
            for k, e in enumerate(trace)
        ]
        rec["ops_over_prediction"] = sum(d > 0 for d in over)
        if rec["ops_over_prediction"]:
            rec["most_over_kib"] = round(max(over) / 1024, 2)
            rec["first_over"] = next(e["operations"] for e, d in zip(trace, over) if d > 0)
    except Exception as e:  # noqa
        rec["peak_error"] = str(e)[:200]
    rec["s"] = round(time.time() - t0, 1)
    return rec


if __name__ == "__main__":
    groups = {"hf": HF, "timm": TIMM, "tv": TV, "hfv": HFV}
    which = sys.argv[1:] or list(groups)
    for fam in which:
        names = groups[fam] if ":" not in fam else [fam.split(":")[1]]
        fam = fam.split(":")[0]
        for name in names:
            try:
                rec = check(fam, name)
            except Exception as e:  # noqa
                rec = {"model": f"{fam}:{name}", "error": f"{type(e).__name__}: {str(e)[:600]}"}
                tb = traceback.format_exc().splitlines()
                rec["where"] = [l for l in tb if "remat" in l][-3:]
            print(json.dumps(rec), flush=True)
