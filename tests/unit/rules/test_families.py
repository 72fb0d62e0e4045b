"""Each shipped rule set on HF-shaped checkpoints built with torch alone, converted with no --mapping.

The cases, and what PaddleNLP 2.8.1 takes from each, are in test_families_recorded.json, written by
`scripts/check_mappings_paddlenlp.py --record` in a run where every case's converted weights, loaded
into PaddleNLP's own class, gave HF's outputs to fp32 noise. For each key of a converted file it holds
the HF key(s) its values came from and whether they were transposed, found by value. Here the same
HF keys and shapes get new random values, and the file must have exactly those keys, shapes and
values, bit for bit.
"""


import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from helpers.cli import run_convert
from helpers.hf_models import RECORDED, case_id, hf_state
from converter.io.pdparams import load_pdparams

def write(case, state, directory):
    if case["how"] == "safetensors":
        path = directory / "model.safetensors"
        save_file({k: v.clone() for k, v in state.items()}, str(path))
    else:
        path = directory / "pytorch_model.bin"
        torch.save(state, path)
    return path


@pytest.mark.parametrize("case", RECORDED, ids=[case_id(c) for c in RECORDED])
@pytest.mark.slow
def test_family_converts_as_paddlenlp_takes_it(tmp, case):
    state = hf_state(case)
    src = write(case, state, tmp)
    r = run_convert(src, tmp / "out.pdparams", "--quiet", "--target", "paddlenlp")
    assert r.code == 0, r
    named = r.stderr.split("mapping: detected '")[1].split("'")[0]
    assert named in [case["family"]] + case["same_file"], r.stderr
    out = load_pdparams(str(tmp / "out.pdparams"))
    assert sorted(out) == sorted(case["paddle"])
    for name, (sources, transposed, shape) in case["paddle"].items():
        expected = state[sources[0]].numpy()
        expected = expected.T if transposed else expected
        assert list(out[name].shape) == shape, name
        assert out[name].dtype == expected.dtype and np.array_equal(out[name], expected), name


HEADS = {  # the HF classes with a PaddleNLP 2.8.1 counterpart, each replayed above
    "deberta-v2": {"Model", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice"},
    "roberta": {"Model", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMaskedLM", "ForMultipleChoice"},
    "electra": {"Model", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice",
                "ForPreTraining", "ForMaskedLM"},
    "t5": {"ForConditionalGeneration"}, "opt": {"Model", "ForCausalLM"},
    "bloom": {"Model", "ForCausalLM", "ForSequenceClassification", "ForTokenClassification"}, "mixtral": {"ForCausalLM"},
}
PREFIX = {"deberta-v2": "DebertaV2", "roberta": "Roberta", "electra": "Electra", "t5": "T5", "opt": "OPT", "bloom": "Bloom",
          "mixtral": "Mixtral"}


@pytest.mark.parametrize("family", sorted(HEADS))
def test_every_new_family_is_recorded_with_its_heads(family):
    classes = {c["hf_class"] for c in RECORDED if c["family"] == family}
    assert classes == {PREFIX[family] + h for h in HEADS[family]}


@pytest.mark.slow


def test_deberta_v2_xlarge_query_proj_is_transposed(tmp):
    """The user story: a square 1536x1536 query_proj is transposed (decided by name, not shape)."""
    case = next(c for c in RECORDED if c["family"] == "deberta-v2" and c["note"].startswith("1536"))
    state = hf_state(case, seed=1)
    torch.save(state, tmp / "m.bin")
    assert run_convert(tmp / "m.bin", tmp / "o.pdparams", "--quiet").code == 0
    out = load_pdparams(str(tmp / "o.pdparams"))
    q = state["encoder.layer.0.attention.self.query_proj.weight"].numpy()
    assert q.shape == (1536, 1536)
    assert np.array_equal(out["encoder.layer.0.attention.self.query_proj.weight"], q.T)
    rel = state["encoder.rel_embeddings.weight"].numpy()
    assert np.array_equal(out["encoder.rel_embeddings.weight"], rel)  # an embedding: never transposed
