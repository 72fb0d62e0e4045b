"""PaConvert's output of real model files against the torch originals: verify-port and
convert-weights with rules inferred from the two models (mapping None, no rule file).

Each paddle model is PaConvert 3.3.1's translation of a torchvision model file (or HF transformers
4.44.2's modeling_bert.py), made at test time from the installed package with the least hand fix
that makes it run on paddle 3.3.1 (ports_paconvert.py lists each fix and why; HF's file gets paddle
stand-ins of the parts of PreTrainedModel its forward uses). PaConvert writes `paddle.compat.nn.Linear` for
`nn.Linear`, which keeps torch's `[out, in]` layout: nothing may be transposed. Clean pairs pass
under both strategies and convert; in the Vision Transformer, torchvision's MLP and a BERT with
intermediate size = hidden size every Linear is square, so a transposed weight would still fit
every shape: they must pass too, and their converted Linears hold torch's weights as they are.

Runs in the side environment of scripts/side_env_ports.sh; elsewhere it is skipped.
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("torchvision")
pytest.importorskip("paconvert")
pytest.importorskip("paddle")
pytest.importorskip("transformers")

from ports_harness import assert_converts_to_torchs_outputs, convert, named_at, verify  # noqa: E402
from ports_paconvert import ConvertedPair, set_on_layers, tensor_patches_of  # noqa: E402

STRATEGIES = ("full", "binary")
NO_AUX = (("aux_logits", False), ("init_weights", True))
# every Linear square (64 x 64): hidden, MLP and classes alike
SQUARE_VIT = (("image_size", 32), ("patch_size", 8), ("num_layers", 2), ("num_heads", 4), ("hidden_dim", 64),
              ("mlp_dim", 64), ("num_classes", 64))
SMALL_SWIN = (("patch_size", [4, 4]), ("embed_dim", 32), ("depths", [2, 2]), ("num_heads", [2, 4]),
              ("window_size", [4, 4]), ("num_classes", 10))

def bert_config(intermediate_size):
    from transformers import BertConfig
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=intermediate_size, max_position_embeddings=64, return_dict=False)
    config._attn_implementation = "eager"  # the attention BertModel writes out (no torch SDPA)
    return config


def token_ids():
    ids = np.random.default_rng(0).integers(1, 99, (2, 12)).astype("int64")
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


CLEAN = [
    ConvertedPair("resnet18", "torchvision/models/resnet.py", "resnet18", 64),
    ConvertedPair("mobilenet_v2", "torchvision/models/mobilenetv2.py", "mobilenet_v2", 64),
    ConvertedPair("mobilenet_v3_small", "torchvision/models/mobilenetv3.py", "mobilenet_v3_small", 64),
    ConvertedPair("vgg11_bn", "torchvision/models/vgg.py", "vgg11_bn", 64),
    ConvertedPair("squeezenet1_1", "torchvision/models/squeezenet.py", "squeezenet1_1", 64),
    ConvertedPair("alexnet", "torchvision/models/alexnet.py", "alexnet", 64),
    ConvertedPair("googlenet", "torchvision/models/googlenet.py", "googlenet", 64, NO_AUX),
    ConvertedPair("densenet121", "torchvision/models/densenet.py", "densenet121", 64),
    ConvertedPair("shufflenet_v2_x0_5", "torchvision/models/shufflenetv2.py", "shufflenet_v2_x0_5", 64),
    ConvertedPair("inception_v3", "torchvision/models/inception.py", "inception_v3", 75, NO_AUX),
    ConvertedPair("mnasnet0_5", "torchvision/models/mnasnet.py", "mnasnet0_5", 64),
    ConvertedPair("swin-small", "torchvision/models/swin_transformer.py", "SwinTransformer", 32, SMALL_SWIN),
    ConvertedPair("vit-square", "torchvision/models/vision_transformer.py", "VisionTransformer", 32, SQUARE_VIT),
    # torchvision.ops.MLP: three square Linears and nothing else
    ConvertedPair("mlp-square", "torchvision/ops/misc.py", "MLP", 0, (("in_channels", 64), ("hidden_channels", [64, 64, 64])),
                  input_shape=(2, 64)),
    # HF BERT: query, key, value, attention output and pooler square; all square with intermediate 32
    ConvertedPair("hf-bert", "transformers/models/bert/modeling_bert.py", "BertModel", kwargs=(("config", bert_config(37)),),
                  inputs=token_ids),
    ConvertedPair("hf-bert-square", "transformers/models/bert/modeling_bert.py", "BertModel",
                  kwargs=(("config", bert_config(32)),), inputs=token_ids),
]

# (a port with a bug planted in PaConvert's output, the torch module that must be named first)
PLANTED = [
    # the hand fix of mobilenetv3.py's `partial(BatchNorm2D, eps=0.001, ...)` done by dropping eps:
    # paddle's default epsilon 1e-5 instead of torch's 1e-3
    (ConvertedPair("mobilenet_v3_small-batchnorm-epsilon-default", "torchvision/models/mobilenetv3.py", "mobilenet_v3_small", 64,
                   fix=set_on_layers("BatchNorm2D", "_epsilon", 1e-5)), "features.0.1"),
    # the first GELU of a Swin block in its tanh form
    (ConvertedPair("swin-small-gelu-tanh", "torchvision/models/swin_transformer.py", "SwinTransformer", 32, SMALL_SWIN,
                   fix=set_on_layers("GELU", "_approximate", True, first_only=True)), "features.1.0.mlp.1"),
]


DIAGNOSES = {"mobilenet_v3_small-batchnorm-epsilon-default": "epsilon differs: torch eps=0.001, paddle epsilon=1e-05",
             "swin-small-gelu-tanh": "GELU variant"}

# Verifier defects these cases show: strict expected failures, each taken away once fixed.

DEFECTS: dict[str, str] = {}  # pair name -> a defect of the tool that fails it, while one does


@pytest.fixture(autouse=True)
def _the_ports_own_tensor_patches(request):
    """What a converted module set on paddle.Tensor at import is set only while that port runs
    (PaConvert's BERT replaces Tensor.split for the whole process: paddle.compat's
    MultiheadAttention, in a port run after it, then fails on its own split)."""
    params = getattr(request.node, "callspec", None)
    params = params.params if params is not None else {}
    pair = params.get("pair") or next((p for p in CLEAN if p.name == params.get("name")), None)
    if pair is None:
        yield
        return
    with tensor_patches_of(pair.path):
        yield


def _xfail(name):
    return [pytest.mark.xfail(strict=True, reason=DEFECTS[name])] if name in DEFECTS else []


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("pair", [pytest.param(p, id=p.name, marks=_xfail(p.name)) for p in CLEAN])
def test_clean_paconvert_port_passes(pair, strategy):
    outcome = verify(pair.spec, strategy)
    assert outcome.exit_code == 0 and outcome.verdict == "pass", f"{pair.name} --strategy {strategy}: {outcome}"


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("pair,culprit", PLANTED, ids=[p.name for p, _ in PLANTED])
def test_planted_bug_is_named_at_its_module(pair, culprit, strategy):
    outcome = named_at(pair.name, pair.spec, culprit, strategy)
    if strategy == "full":  # the diagnosis, and no other
        assert len(outcome.causes) == 1 and DIAGNOSES[pair.name] in outcome.causes[0], outcome.causes


@pytest.mark.parametrize("pair", [pytest.param(p, id=p.name, marks=_xfail(p.name)) for p in CLEAN])
def test_clean_paconvert_port_converts(pair, tmp_path):
    assert_converts_to_torchs_outputs(pair.name, pair.spec, tmp_path)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_xfail(n)) for n in ("vit-square", "mlp-square", "hf-bert-square")])
def test_square_compat_linears_are_never_transposed(name, tmp_path):
    """Every Linear of these ports is a square paddle.compat.nn.Linear: the converted file holds
    each as torch has it, [out, in]."""
    import paddle
    import torch
    pair = next(p for p in CLEAN if p.name == name)
    spec = pair.spec()
    linears = {name for name, m in spec.torch_model().named_modules() if isinstance(m, torch.nn.Linear)}
    assert linears and all(m.weight.shape[0] == m.weight.shape[1] for name, m in spec.torch_model().named_modules()
                           if name in linears)
    converted = convert(pair.spec, str(tmp_path))
    assert converted.exit_code == 0, converted.headline
    state = paddle.load(str(tmp_path / "model.pdparams"))
    torch_state = spec.torch_model().state_dict()
    for name in linears:
        np.testing.assert_array_equal(np.asarray(state[f"{name}.weight"]), torch_state[f"{name}.weight"].numpy(),
                                      err_msg=f"{name}.weight")
