"""torchvision against paddle.vision: verify-port and convert-weights with rules inferred from the
two models (no rule file), on random weights.

* Clean pairs pass under both strategies, and convert: the converted file loads into the paddle
  model with no key missing or left over, and both models then give the same outputs.
* paddle.vision's own AlexNet, SqueezeNet and Inception-v3 are not torchvision's as shipped: their
  `Dropout(mode="downscale_in_infer")` scales by 1 - p in eval (torch's dropout is the identity),
  SqueezeNet's max pools round down where torchvision's round up (`ceil_mode=True`; the sizes
  differ from a 64x64 input on), and Inception-v3's BatchNorms use epsilon 1e-5 where
  torchvision's use 1e-3. Their clean pairs set torch's conventions on the paddle side (and
  SqueezeNet's runs at 67x67, where both roundings agree); as shipped, the first difference is
  named at its module.
* Planted bugs (a pool's rounding, an activation, an average pool's padding) are named at their module.

Runs in the side environment of scripts/side_env_ports.sh; elsewhere it is skipped.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("torchvision")
pytest.importorskip("paddle")

from ports_harness import assert_converts_to_torchs_outputs, named_at, verify  # noqa: E402
from ports_vision import (VisionPair, avg_pool_exclusive, batchnorm_epsilon, both, ceil_mode_pool,  # noqa: E402
                          dropout_as_torch, first_activation_relu)

STRATEGIES = ("full", "binary")
INCEPTION = {"aux_logits": False, "init_weights": True}  # paddle.vision's Inception-v3 has no auxiliary head
INCEPTION_AS_TORCH = both(dropout_as_torch, batchnorm_epsilon(1e-3))

CLEAN = [
    VisionPair("resnet18", "resnet18", "resnet18", 64),
    VisionPair("vgg11_bn", "vgg11_bn", "vgg11", 64, paddle_kwargs={"batch_norm": True}),
    VisionPair("mobilenet_v2", "mobilenet_v2", "mobilenet_v2", 64),
    VisionPair("mobilenet_v3_small", "mobilenet_v3_small", "mobilenet_v3_small", 64),
    VisionPair("densenet121", "densenet121", "densenet121", 64),
    VisionPair("shufflenet_v2_x0_5", "shufflenet_v2_x0_5", "shufflenet_v2_x0_5", 64),
    VisionPair("squeezenet1_0", "squeezenet1_0", "squeezenet1_0", 67, fix=dropout_as_torch),
    VisionPair("inception_v3", "inception_v3", "inception_v3", 75, torch_kwargs=INCEPTION, fix=INCEPTION_AS_TORCH),
    VisionPair("alexnet", "alexnet", "alexnet", 224, fix=dropout_as_torch),
]

# (pair, the torch module that must be named first)
DIFFERENT = [
    # paddle.vision as shipped
    # paddle.vision pools with one MaxPool2D three times: its second call is named, at torch's features.6
    (VisionPair("squeezenet1_0-as-shipped-64", "squeezenet1_0", "squeezenet1_0", 64), "features.6"),
    (VisionPair("squeezenet1_0-as-shipped-67", "squeezenet1_0", "squeezenet1_0", 67), "classifier.0"),
    (VisionPair("alexnet-as-shipped", "alexnet", "alexnet", 224), "classifier.0"),
    (VisionPair("inception_v3-as-shipped", "inception_v3", "inception_v3", 75, torch_kwargs=INCEPTION), "Conv2d_1a_3x3.bn"),
    (VisionPair("inception_v3-dropout-as-shipped", "inception_v3", "inception_v3", 75, torch_kwargs=INCEPTION,
                fix=batchnorm_epsilon(1e-3)), "dropout"),
    # planted
    (VisionPair("resnet18-maxpool-ceil-mode", "resnet18", "resnet18", 64, fix=ceil_mode_pool("maxpool")), "maxpool"),
    (VisionPair("mobilenet_v3_small-first-hardswish-relu", "mobilenet_v3_small", "mobilenet_v3_small", 64,
                fix=first_activation_relu("Hardswish")), "features.0.2"),
    # torch's Mixed_5b pools with F.avg_pool2d (no module): its own code is what differs
    (VisionPair("inception_v3-avgpool-exclusive", "inception_v3", "inception_v3", 75, torch_kwargs=INCEPTION,
                fix=both(INCEPTION_AS_TORCH, avg_pool_exclusive("inception_block_list.0.branch_pool"))),
     "Mixed_5b"),
]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("pair", CLEAN, ids=lambda p: p.name)
def test_clean_pair_passes(pair, strategy):
    outcome = verify(pair.spec, strategy)
    assert outcome.exit_code == 0 and outcome.verdict == "pass", f"{pair.name} --strategy {strategy}: {outcome}"


@pytest.mark.parametrize("pair", CLEAN, ids=lambda p: p.name)
def test_clean_pair_converts(pair, tmp_path):
    assert_converts_to_torchs_outputs(pair.name, pair.spec, tmp_path)


# The diagnosis (a part of its cause) that the named module gets, under full.
DIAGNOSES = {
    "inception_v3-as-shipped": "epsilon differs",
    "mobilenet_v3_small-first-hardswish-relu": "paddle computes ReLU where torch computes Hardswish",
    # torch's Mixed_5b pools in its own code; paddle's pool layer inside the block is found by re-running
    "inception_v3-avgpool-exclusive": "has exclusive=True; re-run on torch's recorded inputs with exclusive=False",
}

# Verifier defects these cases show: strict expected failures, each taken away once fixed.
DEFECTS: dict[tuple[str, str], str] = {}


def _runs(cases):
    return [pytest.param(pair, culprit, strategy, id=f"{pair.name}-{strategy}",
                         marks=[pytest.mark.xfail(strict=True, reason=DEFECTS[pair.name, strategy])]
                         if (pair.name, strategy) in DEFECTS else [])
            for pair, culprit in cases for strategy in STRATEGIES]


@pytest.mark.parametrize("pair,culprit,strategy", _runs(DIFFERENT))
def test_difference_is_named_at_its_module(pair, culprit, strategy):
    outcome = named_at(pair.name, pair.spec, culprit, strategy, DIAGNOSES.get(pair.name))
    if pair.name in SHARED_CALLS:
        paddle_call, said = SHARED_CALLS[pair.name]
        assert outcome.named_paddle == paddle_call, outcome
        assert strategy != "full" or said in outcome.headline, outcome


# The call of a layer called more than once that a case names (its paddle key) and how its row says it.
SHARED_CALLS = {"squeezenet1_0-as-shipped-64": ("_pool@2", "paddle _pool, call 2 of 3")}
