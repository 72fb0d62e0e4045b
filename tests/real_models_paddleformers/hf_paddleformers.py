"""What the tests against PaddleFormers 1.2 share (the second side environment,
scripts/side_env_paddleformers.sh): its imports, which skip the test module that imports this one
where transformers 5 or PaddleFormers is not installed, and the two models of a pair, HF's
returning its logits and PaddleFormers' built for the CPU."""

import importlib
import importlib.util
import sys

import pytest

if importlib.util.find_spec("paddleformers") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("needs transformers 5 and PaddleFormers (scripts/side_env_paddleformers.sh)", allow_module_level=True)

import torch  # noqa: E402  (before paddleformers, which otherwise hides torch from transformers)

sys.modules["torchcodec"] = None  # paddlecodec's torchcodec has no distribution metadata: transformers trips on it
transformers = pytest.importorskip("transformers")


def stand_ins():
    """The modeling files of qwen2, qwen3, glm4_moe and their kin import paddlefleet's GPT provider at
    the top, which their plain-paddle classes do not use, and the MoE token dispatcher asks
    paddlefleet_ops whether DeepEP exists: the stand-ins verify-port HF_DIR PADDLE_DIR uses let
    them import."""
    from converter.hf.classes import FLEET_OPS, PROVIDER, add_stand_in
    for name in (PROVIDER, FLEET_OPS):
        add_stand_in(name)


def hf_logits(model_class, config):
    """HF's model_class built from config with torch seeded with 0, in eval mode, its forward taking
    input_ids alone and returning the logits (no cache)."""
    torch.manual_seed(0)

    class Logits(model_class):
        def forward(self, input_ids):
            return super().forward(input_ids=input_ids, use_cache=False).logits
    return Logits(config).eval()


def paddleformers_class(family: str, name: str):
    """The class `name` of PaddleFormers' modeling file of the family."""
    stand_ins()
    return getattr(importlib.import_module(f"paddleformers.transformers.{family}.modeling"), name)


def paddleformers_config(family: str, name: str, hf_config):
    """PaddleFormers' config class `name` of the family with every field of HF's config (HF's
    defaults as HF's model has them)."""
    stand_ins()
    fields = hf_config.to_dict()
    fields.pop("transformers_version", None)
    return getattr(importlib.import_module(f"paddleformers.transformers.{family}.configuration"), name)(**fields)


def paddleformers_model(family: str, name: str, config):
    """PaddleFormers' class `name` of the family built from config for the CPU: no fused norm (paddle
    3.3.1 has no CPU kernel for it), no cache."""
    config.fuse_rms_norm = False
    config.use_cache = False
    return paddleformers_class(family, name)(config)
