"""convert-weights on a bare HF transformers 5 weights file (no config.json) for PaddleFormers 1.2, on
tiny random models (the sizes and fields of test_rule_sets.py):

* ERNIE 4.5's file holds Llama's key set: 'paddleformers-llama' is used (its plan needs no config
  field), and the line says that 'paddleformers-ernie4_5' names every key too but needs the
  config's num_key_value_heads. Both are true of PaddleFormers' classes: the file written loads into
  its LlamaForCausalLM, and ERNIE 4.5's set lays the keys out as its Ernie4_5ForCausalLM holds them.
* Qwen3-MoE's file: no set builds its plan without the config; the closest offered is
  'paddleformers-qwen3_moe', whose layout is PaddleFormers' Qwen3-MoE class's, never
  'paddleformers-glm4_moe', which names every key too but keeps the router [experts, hidden] where
  that class holds [hidden, experts].

Runs in the second side environment (scripts/side_env_paddleformers.sh)."""

import numpy as np
import pytest

from helpers.cli import run_convert
from hf_paddleformers import paddleformers_class, paddleformers_config
from test_rule_sets import FAMILIES, _hf_model

from converter.io import open_source
from converter.rules.detect import closest, try_ruleset, _conflict
from converter.rules.ruleset import resolve_mapping

ROUTER = "model.layers.0.mlp.gate.weight"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    made = {}

    def make(family):
        if family not in made:
            directory = tmp_path_factory.mktemp(family) / "hf"
            made[family] = (_hf_model(family, directory), directory)
        return made[family]
    return make


def _infos(directory) -> dict:
    with open_source(str(directory / "model.safetensors")) as source:
        return dict(source.infos)


def _paddleformers(family, hf_model):
    """PaddleFormers' plain-paddle class of the family, built from HF's config."""
    config_class, _, cls = FAMILIES[family]
    config = paddleformers_config(family, config_class, hf_model.config)
    config.fuse_rms_norm = False
    return paddleformers_class(family, cls)(config)


def _laid_out(plan) -> dict:
    return {info.name: tuple(info.shape) for info in plan.output_infos()}


def test_an_ernie_file_is_converted_as_llama_and_the_line_says_ernie_fits_every_key_too(saved, tmp_path):
    hf, directory = saved("ernie4_5")
    r = run_convert(directory / "model.safetensors", tmp_path / "ernie.pdparams")
    assert r.code == 0, r
    [line] = [line for line in r.stderr.splitlines() if line.startswith("mapping:")]
    assert line.startswith("mapping: detected 'paddleformers-llama' for PaddleFormers 1.2 (maps all 21 keys)"), line
    assert "'paddleformers-ernie4_5'" in line and "name every key too" in line, line
    assert "the config field 'num_key_value_heads', which the weights alone do not hold" in line, line
    assert "('paddleformers-llama' is used: its plan needs no config field)" in line, line

    from converter.io.pdparams import load_pdparams
    written = load_pdparams(str(tmp_path / "ernie.pdparams"))
    llama = paddleformers_class("llama", "LlamaForCausalLM")(paddleformers_config("llama", "LlamaConfig", hf.config))
    held = {k: tuple(v.shape) for k, v in llama.state_dict().items()}
    assert {k: v.shape for k, v in written.items()} == held  # the file is PaddleFormers' Llama's, key for key
    llama.set_state_dict(written)
    assert np.array_equal(llama.state_dict()["model.layers.1.self_attn.q_proj.weight"].numpy(),
                          hf.state_dict()["model.layers.1.self_attn.q_proj.weight"].numpy().T)

    ernie = try_ruleset(_infos(directory), resolve_mapping("paddleformers-ernie4_5"))
    assert not ernie.unmapped and not ernie.fits and ernie.needs == ["num_key_value_heads"], ernie.problems
    ernie_model = _paddleformers("ernie4_5", hf)
    assert _laid_out(ernie.layout) == {k: tuple(v.shape) for k, v in ernie_model.state_dict().items()}


def test_a_qwen3_moe_file_is_offered_its_own_set_as_the_closest_never_one_laying_the_router_out_otherwise(saved,
                                                                                                        tmp_path):
    hf, directory = saved("qwen3_moe")
    r = run_convert(directory / "model.safetensors", tmp_path / "moe.pdparams")
    assert r.code == 2 and r.stdout == "", r
    [line] = r.stderr.strip().splitlines()
    assert "the closest, 'paddleformers-qwen3_moe', names every key" in line and "glm4_moe" not in line, line
    assert "'num_key_value_heads', which is not known here" in line, line

    infos = _infos(directory)
    qwen = try_ruleset(infos, resolve_mapping("paddleformers-qwen3_moe"))
    glm = try_ruleset(infos, resolve_mapping("paddleformers-glm4_moe"))
    assert not qwen.unmapped and not glm.unmapped and qwen.layout is not None and glm.layout is not None
    experts, hidden = hf.config.num_experts, hf.config.hidden_size
    model = _paddleformers("qwen3_moe", hf)
    held = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert held[ROUTER] == (hidden, experts) and _laid_out(qwen.layout) == held  # the set PaddleFormers' class takes
    assert _laid_out(glm.layout)[ROUTER] == (experts, hidden)  # that class would refuse this router
    said = _conflict(glm, qwen, infos)
    assert said is not None and repr(ROUTER) in said and f"[{experts}, {hidden}] where" in said, said
    assert glm.unused_rules > qwen.unused_rules
    offered, passed_over = closest([glm, qwen], infos)
    assert offered is qwen and not passed_over
