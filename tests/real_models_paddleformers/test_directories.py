"""What PaddleFormers 1.2's from_pretrained makes of a directory that `convert-weights HF_DIR OUT_DIR`
wrote, on tiny random HF transformers 5 models (the sizes of test_rule_sets.py):

* its default path (load_checkpoint_format="flex_checkpoint", convert_from_hf=True) always runs
  the class's own HF -> paddle statements over the directory's *.safetensors: on OUT_DIR, which
  holds paddle weights, it raises rather than loading random weights; the paddle weights load
  with load_checkpoint_format=None, convert_from_hf=False, through the Auto class too, single or
  sharded, every tensor bit for bit the file's;
* tied LM heads: where PaddleFormers' class ties the head itself (its LMHead holds the embedding's
  parameter) the file holds no head, elsewhere (Qwen2-MoE, Qwen3-MoE) a copy of the embeddings;
  either way the loaded head is the embeddings and the logits match HF's; a Llama config.json that does not say
  tie_word_embeddings (HF unties, PaddleFormers' LlamaConfig would tie) is written untied.
Runs in the second side environment (scripts/side_env_paddleformers.sh); elsewhere it is skipped."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from helpers.cli import run_convert

if importlib.util.find_spec("paddleformers") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("needs transformers 5 and PaddleFormers (scripts/side_env_paddleformers.sh)", allow_module_level=True)

import torch  # noqa: E402  (before paddleformers, which otherwise hides torch from transformers)
from hf_paddleformers import paddleformers_class  # noqa: E402
from test_rule_sets import FAMILIES, NOISE_FACTOR, SIZES, TRAIN_MODE, _hf_model, _logits_pf  # noqa: E402

paddle = pytest.importorskip("paddle")
auto = pytest.importorskip("paddleformers.transformers")
RUNS_WITHOUT_PADDLEFLEET = ["ernie4_5", "llama", "phi3"]  # the Auto class of the others is paddlefleet's
PADDLE_WEIGHTS = {"load_checkpoint_format": None, "convert_from_hf": False}


def _state(model) -> dict:
    return {k: v.numpy() for k, v in model.state_dict().items()}


def _assert_every_tensor_arrived(model, directory):
    """The loaded model's state dict is, key for key and bit for bit, what the directory's files hold
    (a head the files do not hold must be the model's word embeddings: PaddleFormers tied it)."""
    from converter.io.pdparams import load_pdparams
    files = sorted(directory.glob("model_state*.pdparams"))
    written = {k: v for f in files for k, v in load_pdparams(str(f)).items()}
    loaded = _state(model)
    if "lm_head.weight" not in written:
        assert model.lm_head.weight is model.get_input_embeddings().weight
        written["lm_head.weight"] = written["model.embed_tokens.weight"]
    assert sorted(loaded) == sorted(written)
    for name, array in written.items():
        assert array.dtype == loaded[name].dtype and np.array_equal(loaded[name], array), name


def _match_hf(hf, model, family):
    ids = np.random.default_rng(0).integers(0, SIZES["vocab_size"], size=(2, 12))
    with torch.no_grad():
        hf32 = hf(torch.from_numpy(ids)).logits.double().numpy()
        hf64 = hf.double()(torch.from_numpy(ids)).logits.numpy()
    pf = _logits_pf(model, ids, train_mode=family.split()[0] in TRAIN_MODE)  # GPT-OSS's eval path reorders routing
    difference, noise = np.abs(pf - hf32).max(), np.abs(hf32 - hf64).max()
    print(f"{family}: max |PaddleFormers - HF fp32| {difference:.2e}, |HF fp32 - HF fp64| {noise:.2e}")
    within = difference <= NOISE_FACTOR * noise
    assert 0 < noise < 1e-4 and within, (difference, noise)


@pytest.mark.parametrize("family", RUNS_WITHOUT_PADDLEFLEET)
def test_default_path_refuses_the_directory_and_the_paddle_weights_load_through_the_auto_class(tmp, family):
    _hf_model(family, tmp / "hf")
    r = run_convert(tmp / "hf", tmp / "out", "--quiet")
    assert r.code == 0, r
    # in a process of its own: the load that fails leaves PaddleFormers' weight initialisation switched off
    # for every model built after it in the same process
    default = subprocess.run([sys.executable, "-c", "import torch, sys; sys.modules['torchcodec'] = None\n"
                              "from paddleformers.transformers import AutoModelForCausalLM\n"
                              f"AutoModelForCausalLM.from_pretrained({str(tmp / 'out')!r})"],
                             capture_output=True, text=True, timeout=600)
    assert default.returncode != 0 and "should be assigned before" in default.stderr, default.stderr[-2000:]
    again = run_convert(tmp / "hf", tmp / "out", "--quiet", "--force")  # over the metadata PaddleFormers may leave
    assert again.code == 0, again
    model = auto.AutoModelForCausalLM.from_pretrained(str(tmp / "out"), **PADDLE_WEIGHTS)
    assert type(model).__name__ == FAMILIES[family][2]
    _assert_every_tensor_arrived(model, tmp / "out")


def test_sharded_directory_loads_every_tensor(tmp):
    hf = _hf_model("llama", tmp / "hf")
    r = run_convert(tmp / "hf", tmp / "out", "--quiet", "--max-shard-size", "60KB")
    assert r.code == 0, r
    shards = sorted(p.name for p in (tmp / "out").glob("model_state-*.pdparams"))
    assert len(shards) > 2 and (tmp / "out" / "model_state.pdparams.index.json").exists()
    index = json.loads((tmp / "out" / "model_state.pdparams.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    model = auto.AutoModelForCausalLM.from_pretrained(str(tmp / "out"), **PADDLE_WEIGHTS)
    _assert_every_tensor_arrived(model, tmp / "out")
    _match_hf(hf, model, "llama (sharded)")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tied_head_is_the_embedding_in_paddleformers(tmp, family, monkeypatch):
    monkeypatch.setitem(SIZES, "tie_word_embeddings", True)
    hf = _hf_model(family, tmp / "hf")
    assert hf.lm_head.weight is hf.get_input_embeddings().weight
    r = run_convert(tmp / "hf", tmp / "out", "--quiet")
    assert r.code == 0, r
    cls = paddleformers_class(family, FAMILIES[family][2])
    model = cls.from_pretrained(str(tmp / "out"), **PADDLE_WEIGHTS)
    _assert_every_tensor_arrived(model, tmp / "out")  # the head shared, or written as the embeddings' copy
    assert np.array_equal(model.lm_head.weight.numpy(), model.get_input_embeddings().weight.numpy())
    _match_hf(hf, model, f"{family} (tied)")


def test_llama_config_that_does_not_say_is_written_untied_as_hf_reads_it(tmp):
    hf = _hf_model("llama", tmp / "hf")
    config = json.loads((tmp / "hf" / "config.json").read_text())
    assert config.pop("tie_word_embeddings") is False
    (tmp / "hf" / "config.json").write_text(json.dumps(config))
    r = run_convert(tmp / "hf", tmp / "out")
    assert r.code == 0, r
    assert "'tie_word_embeddings' is not given: HF unties the LM head by default" in r.stderr
    assert json.loads((tmp / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    cls = paddleformers_class("llama", "LlamaForCausalLM")
    model = cls.from_pretrained(str(tmp / "out"), **PADDLE_WEIGHTS)
    assert model.lm_head.weight is not model.get_input_embeddings().weight
    _assert_every_tensor_arrived(model, tmp / "out")
    _match_hf(hf, model, "llama (no tie field)")
    # what the field's absence would have done: PaddleFormers' LlamaConfig ties by default
    (tmp / "out" / "config.json").write_text(json.dumps(config))
    tied = cls.from_pretrained(str(tmp / "out"), **PADDLE_WEIGHTS)
    assert tied.config.tie_word_embeddings is True and tied.lm_head.weight is tied.get_input_embeddings().weight
