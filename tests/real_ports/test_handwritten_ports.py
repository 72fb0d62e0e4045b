"""Public hand-written ports (ports_handwritten.py): ConvNeXt and RepVGG against PaddleClas' ports,
U^2-Net (small) against PaddleSeg's, each model file vendored under handwritten/ as written but for
the marked hand fixes; and timm's VisionTransformer (installed) against PaddleClas' port of it.
verify-port and convert-weights with rules inferred from the two models (no rule file), on random
weights.

* Clean pairs pass under both strategies, and convert: the converted file loads into the paddle
  model with no key missing or left over, and both models then give the same outputs.
* PaddleSeg's U2Netp returns its seven side outputs as logits, where the original returns them
  through a sigmoid (F.sigmoid in U2NETP.forward): its clean pair applies the sigmoid after the
  paddle model; as shipped, the difference is named at the model's own forward.
* Planted bugs (an epsilon, an activation's form, a dilation lost, an attention scale of the whole
  width where the head's is meant) are named at their module.

Runs in the side environment of scripts/side_env_ports.sh; elsewhere it is skipped.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("timm")  # ConvNeXt's file imports DropPath, trunc_normal_ and register_model from it
pytest.importorskip("torchvision")  # U^2-Net's file imports torchvision.models
pytest.importorskip("paddle")

from ports_harness import assert_converts_to_torchs_outputs, named_at, verify  # noqa: E402
from ports_handwritten import HandwrittenPair, replace_layer, set_attr, sigmoid_outputs  # noqa: E402
from ports_vision import both  # noqa: E402

STRATEGIES = ("full", "binary")


def _conv_without_dilation():
    import paddle
    return paddle.nn.Conv2D(16, 16, 3, padding=1)  # the original's REBNCONV(16, 16, dirate=2): dilation 2, padding 2


CLEAN = [
    HandwrittenPair("convnext", "convnext", 32),
    HandwrittenPair("repvgg", "repvgg", 32),
    HandwrittenPair("u2netp", "u2netp", 64, fix=sigmoid_outputs),
    HandwrittenPair("vit-timm", "vit-timm", 32),
    # the same port on a smaller image: a false alarm at the model's own forward (DEFECTS)
    HandwrittenPair("u2netp-32", "u2netp", 32, fix=sigmoid_outputs),
]

# (pair, the torch module that must be named first: "" is the model itself)
DIFFERENT = [
    # as shipped
    (HandwrittenPair("u2netp-logits-as-shipped", "u2netp", 64), ""),
    # planted
    (HandwrittenPair("convnext-layernorm-epsilon-default", "convnext", 32, fix=set_attr("stages.1.0.norm", "_epsilon", 1e-5)),
     "stages.1.0.norm"),
    (HandwrittenPair("convnext-gelu-tanh", "convnext", 32, fix=set_attr("stages.2.1.act", "_approximate", True)),
     "stages.2.1.act"),
    (HandwrittenPair("convnext-channels-first-norm-epsilon", "convnext", 32,
                     fix=set_attr("downsample_layers.2.0", "epsilon", 1e-3)), "downsample_layers.2.0"),
    (HandwrittenPair("repvgg-identity-bn-epsilon", "repvgg", 32, fix=set_attr("stage2.1.rbr_identity", "_epsilon", 1e-3)),
     "stage2.1.rbr_identity"),
    (HandwrittenPair("vit-timm-layernorm-epsilon-default", "vit-timm", 32, fix=set_attr("blocks.1.norm2", "_epsilon", 1e-5)),
     "blocks.1.norm2"),
    # the scale of PaddleClas' own ViT_small builder (qk_scale=768**-0.5): the embedding width's, not a head's
    (HandwrittenPair("vit-timm-qk-scale-of-width", "vit-timm", 32, fix=set_attr("blocks.0.attn", "scale", 32 ** -0.5)),
     "blocks.0.attn"),
    (HandwrittenPair("u2netp-dilation-lost", "u2netp", 64,
                     fix=both(sigmoid_outputs, replace_layer("stage1.rebnconv7.conv_s1", _conv_without_dilation))),
     "stage1.rebnconv7.conv_s1"),
]

# The diagnosis (a part of its cause) that the named module gets, under full.
DIAGNOSES = {
    "u2netp-logits-as-shipped": "<model>'s own forward",
    "convnext-layernorm-epsilon-default": "epsilon differs",
    "convnext-gelu-tanh": "GELU variant",
    "repvgg-identity-bn-epsilon": "epsilon differs",
    "vit-timm-layernorm-epsilon-default": "epsilon differs",
    "vit-timm-qk-scale-of-width": "has scale=0.1767",
}

# Tool defects these cases show: strict expected failures, each taken away once fixed.
DEFECTS: dict[tuple[str, str], str] = {}


def _marks(name, strategy):
    return [pytest.mark.xfail(strict=True, reason=DEFECTS[name, strategy])] if (name, strategy) in DEFECTS else []


def _runs(cases):
    return [pytest.param(pair, culprit, strategy, id=f"{pair.name}-{strategy}", marks=_marks(pair.name, strategy))
            for pair, culprit in cases for strategy in STRATEGIES]


@pytest.mark.parametrize("pair,strategy", [pytest.param(p, s, id=f"{p.name}-{s}", marks=_marks(p.name, s))
                                           for p in CLEAN for s in STRATEGIES])
def test_clean_handwritten_port_passes(pair, strategy):
    outcome = verify(pair.spec, strategy)
    assert outcome.exit_code == 0 and outcome.verdict == "pass", f"{pair.name} --strategy {strategy}: {outcome}"


# u2netp-32 is left out: its first output differs end to end by 4.1e-4 (within verify-port's end-to-end
# budget, 2.5e-3, with paddle's own drift measured), over this check's fixed 1e-4.
@pytest.mark.parametrize("pair", [p for p in CLEAN if p.name != "u2netp-32"], ids=lambda p: p.name)
def test_clean_handwritten_port_converts(pair, tmp_path):
    assert_converts_to_torchs_outputs(pair.name, pair.spec, tmp_path)


@pytest.mark.parametrize("pair,culprit,strategy", _runs(DIFFERENT))
def test_difference_is_named_at_its_module(pair, culprit, strategy):
    named_at(pair.name, pair.spec, culprit, strategy, DIAGNOSES.get(pair.name))
