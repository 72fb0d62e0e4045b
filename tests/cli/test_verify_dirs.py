"""verify-port HF_DIR PADDLE_DIR: every bad input is one line on stderr and exit 2, nothing on stdout,
no report file written, neither directory changed. This environment has neither transformers nor
PaddleFormers/PaddleNLP: a well-formed pair of directories gets the line a user without them sees.
(The real pairs run in the PaddleFormers side environment: tests/real_models_paddleformers/test_verify_dirs.py.)"""

import hashlib
import importlib.util
import json
import os

import numpy as np
import pytest

from helpers.cli import run_verify

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128, "hidden_size": 8,
         "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1}


def _write_pdparams(path, arrays: dict) -> None:
    from converter.io.base import TensorInfo
    from converter.io.pdparams import write_pdparams
    with open(path, "wb") as f:
        write_pdparams(f, [TensorInfo(k, str(v.dtype), v.shape) for k, v in arrays.items()], lambda i: arrays[i.name])


@pytest.fixture
def dirs(tmp):
    """A well-formed pair: HF_DIR with config.json and a weights file, PADDLE_DIR with config.json and
    model_state.pdparams."""
    hf, pd = tmp / "hf", tmp / "pd"
    hf.mkdir()
    pd.mkdir()
    (hf / "config.json").write_text(json.dumps(LLAMA))
    (hf / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (pd / "config.json").write_text(json.dumps(LLAMA))
    _write_pdparams(pd / "model_state.pdparams", {"model.norm.weight": np.ones(8, np.float32)})
    return hf, pd


def _contents(*directories) -> dict:
    out = {}
    for directory in directories:
        for root, _, files in os.walk(directory):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    out[os.path.join(root, name)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _one_line(r, *expected):
    assert r.code == 2 and r.stdout == "", r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def _verify_refused(tmp, hf, pd, *expected, extra=()):
    before = _contents(hf, pd)
    report = tmp / "report.json"
    r = run_verify(hf, pd, "--json", report, *extra)
    line = _one_line(r, *expected)
    assert not report.exists() and _contents(hf, pd) == before
    return line


def test_one_directory_alone_is_refused(dirs):
    _one_line(run_verify(dirs[0]), "two directories, HF_DIR PADDLE_DIR; got 1")


def test_three_directories_are_refused(dirs, tmp):
    _one_line(run_verify(dirs[0], dirs[1], tmp), "two directories, HF_DIR PADDLE_DIR; got 3")


@pytest.mark.parametrize("option", [["--spec", "x.py"], ["--weights", "w.pt"], ["--converted", "w.pdparams"],
                                    ["--train", "--emit-optimizer", "opt.py"]])
def test_options_of_a_spec_are_refused_with_directories(dirs, option):
    _one_line(run_verify(*dirs, *option), option[-2] if option[0] == "--train" else option[0], "not both")


def test_a_missing_hf_dir(dirs, tmp):
    _verify_refused(tmp, tmp / "nowhere", dirs[1], "HF_DIR", "is not a directory", "save_pretrained")


def test_a_file_given_as_hf_dir(dirs, tmp):
    _verify_refused(tmp, dirs[0] / "config.json", dirs[1], "HF_DIR", "is not a directory")


def test_an_hf_dir_without_config(dirs, tmp):
    os.remove(dirs[0] / "config.json")
    _verify_refused(tmp, *dirs, "HF_DIR", "is not a model directory (it has no config.json)")


def test_a_paddle_dir_without_config(dirs, tmp):
    os.remove(dirs[1] / "config.json")
    _verify_refused(tmp, *dirs, "PADDLE_DIR", "is not a model directory", "convert-weights HF_DIR OUT_DIR")


def test_an_hf_config_that_is_not_json(dirs, tmp):
    (dirs[0] / "config.json").write_text("{not json")
    _verify_refused(tmp, *dirs, "is not valid JSON")


def test_an_hf_config_naming_no_architecture(dirs, tmp):
    (dirs[0] / "config.json").write_text(json.dumps({k: v for k, v in LLAMA.items() if k != "architectures"}))
    _verify_refused(tmp, *dirs, "names no model class in 'architectures'")


def test_an_hf_dir_without_weights(dirs, tmp):
    os.remove(dirs[0] / "model.safetensors")
    _verify_refused(tmp, *dirs, "HF_DIR", "holds no weights")


def test_a_paddle_dir_without_weights(dirs, tmp):
    os.remove(dirs[1] / "model_state.pdparams")
    _verify_refused(tmp, *dirs, "PADDLE_DIR", "holds no paddle weights", "convert-weights HF_DIR")


def test_a_paddle_index_that_is_not_an_index(dirs, tmp):
    (dirs[1] / "model_state.pdparams.index.json").write_text("[1, 2]")
    _verify_refused(tmp, *dirs, "is not a weights index")


def test_a_report_inside_an_input_directory_is_refused(dirs):
    before = _contents(*dirs)
    r = run_verify(*dirs, "--json", dirs[0] / "report.json")
    _one_line(r, "--json")
    assert _contents(*dirs) == before


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None, reason="transformers is installed here")
def test_without_transformers_the_user_is_told_to_install_it(dirs, tmp):
    line = _verify_refused(tmp, *dirs, "builds the torch model with transformers, which is not installed",
                           "pip install transformers", "port spec")
    assert "docs/verify-port.md" in line


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None, reason="transformers is installed here")
def test_the_api_raises_the_same_line(dirs):
    from converter import UserError, verify_directories
    with pytest.raises(UserError, match="transformers, which is not installed"):
        verify_directories(str(dirs[0]), str(dirs[1]))


@pytest.mark.skipif(any(importlib.util.find_spec(m) for m in ("paddleformers", "paddlenlp")),
                    reason="a paddle model library is installed here")
def test_without_paddleformers_or_paddlenlp_the_user_is_told_to_install_one():
    from converter.errors import UserError
    from converter.hf.classes import paddle_class_of
    with pytest.raises(UserError, match=r"neither of which is installed; install paddleformers \(pip install "
                                        r"paddleformers\) or paddlenlp"):
        paddle_class_of("LlamaForCausalLM")


def test_token_inputs_are_seeded_with_a_padded_second_row():
    from converter.hf.pair import LENGTH, PADDED, token_inputs
    first, again = token_inputs({"vocab_size": 50, "pad_token_id": 3}), token_inputs({"vocab_size": 50, "pad_token_id": 3})
    assert all(np.array_equal(first[k], again[k]) for k in first)
    ids, mask = first["input_ids"], first["attention_mask"]
    assert ids.shape == mask.shape == (2, LENGTH) and ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < 50
    assert mask[0].all() and mask[1, :LENGTH - PADDED].all() and not mask[1, LENGTH - PADDED:].any()
    assert (ids[1, LENGTH - PADDED:] == 3).all()
    unpadded = token_inputs({"vocab_size": 50})["input_ids"]  # no pad_token_id: the padded tail keeps its draws
    assert np.array_equal(unpadded[0], ids[0]) and len(set(unpadded[1, LENGTH - PADDED:].tolist())) > 1


@pytest.mark.parametrize("vocab", [None, 0, "128", True, 1.5])
def test_a_vocabulary_size_to_draw_from_is_required(vocab):
    from converter.errors import UserError
    from converter.hf.pair import token_inputs
    config = {} if vocab is None else {"vocab_size": vocab}
    with pytest.raises(UserError, match="'vocab_size' is .*, not a positive integer"):
        token_inputs(config)


def test_the_causal_lm_losses_agree_and_leave_the_padded_positions_out():
    """--train's next-token loss, torch's and paddle's, on the same logits: equal, and the mean over
    the labels counted (paddle's own cross_entropy "mean" would divide by every label)."""
    import paddle
    import torch

    from converter.hf.pair import IGNORED, _causal_labels, _paddle_causal_loss, _torch_causal_loss, token_inputs
    inputs = token_inputs({"vocab_size": 11})
    labels = _causal_labels(inputs)
    assert (labels[inputs["attention_mask"] == 0] == IGNORED).all() and (labels[0] == inputs["input_ids"][0]).all()
    logits = np.random.default_rng(3).normal(size=labels.shape + (11,)).astype(np.float32)
    lt = _torch_causal_loss((torch.from_numpy(logits),), torch.from_numpy(labels)).item()
    lp = _paddle_causal_loss((paddle.to_tensor(logits),), paddle.to_tensor(labels)).item()
    shifted, targets = logits[:, :-1].reshape(-1, 11).astype(np.float64), labels[:, 1:].reshape(-1)
    counted = targets != IGNORED
    log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    expected = -log_softmax[counted, targets[counted]].mean()
    assert abs(lt - expected) < 1e-5 and abs(lp - expected) < 1e-5, (lt, lp, expected)


def test_the_classification_losses_agree():
    import paddle
    import torch

    from converter.hf.pair import BATCH, _class_labels, _paddle_class_loss, _torch_class_loss, training_loss
    loss = training_loss("BertForSequenceClassification", {"id2label": {"0": "a", "1": "b", "2": "c"}})
    assert "3 classes" in loss.what
    labels = loss.target({})
    assert labels.shape == (BATCH,) and labels.max() < 3 and np.array_equal(labels, _class_labels(3))
    logits = np.random.default_rng(4).normal(size=(BATCH, 3)).astype(np.float32)
    lt = _torch_class_loss(torch.from_numpy(logits), torch.from_numpy(labels)).item()
    lp = _paddle_class_loss(paddle.to_tensor(logits), paddle.to_tensor(labels)).item()
    assert abs(lt - lp) < 1e-6


def test_architectures_without_a_known_loss_get_the_default_one():
    from converter.hf.pair import training_loss
    assert training_loss("BertModel", {}) is None
    assert "causal-LM" in training_loss("LlamaForCausalLM", {}).what
    assert "causal-LM" in training_loss("GPT2LMHeadModel", {}).what
