"""HF config.json -> PaddleNLP 2.8.1 config.json, field by field, for every family.

Each HF config below is what HF 4.44 writes for a model of that family (save_pretrained of a
hub-like config); each expected config uses the field names PaddleNLP 2.8.1's config class and
modeling read (scripts/check_mappings_paddlenlp.py builds PaddleNLP's models from these
translations and compares their outputs with HF's)."""

import pytest

from converter.errors import UserError
from converter.hf.config import FAMILIES, translate_config
from helpers.hf_configs import CASES, COMMON


@pytest.mark.parametrize("family", sorted(CASES))
def test_each_field_is_said_in_paddlenlp_names(family):
    hf, expected = CASES[family]
    got = translate_config({**hf, **COMMON}, target="paddlenlp")
    assert got.family is FAMILIES[family]
    assert got.config == expected
    assert got.notes == [n for n in got.notes if n.startswith("left out '")]
    left_out = {n.split("'")[1] for n in got.notes}
    assert {"transformers_version", "_name_or_path"} <= left_out


def test_every_family_is_covered():
    assert sorted(CASES) == sorted(FAMILIES)


@pytest.mark.parametrize("family,field,value,words", [
    ("bert", "position_embedding_type", "relative_key", "always behaves as 'absolute'"),
    ("bert", "hidden_act", "gelu_new", "'gelu_new' has no PaddleNLP counterpart"),
    ("gpt2", "activation_function", "gelu", "it takes 'gelu_new', 'gelu_pytorch_tanh'"),
    ("gpt2", "layer_norm_epsilon", 1e-6, "always behaves as 1e-05"),
    ("llama", "rope_scaling", {"type": "linear", "factor": 2.0}, "'rope_scaling'"),
    ("llama", "hidden_act", "gelu", "always behaves as 'silu'"),
    ("deberta-v2", "conv_act", "tanh", "always behaves as 'gelu'"),
    ("t5", "feed_forward_proj", "gelu", "'feed_forward_proj': 'gelu' has no PaddleNLP counterpart"),
    ("t5", "relative_attention_max_distance", 16, "always behaves as 128"),
    ("opt", "activation_function", "gelu", "'activation_function': 'gelu'"),
    ("mixtral", "router_jitter_noise", 0.1, "'router_jitter_noise'"),
    ("roberta", "architectures", ["RobertaForNothing"], "'RobertaForNothing' has no PaddleNLP class"),
    ("electra", "some_new_field", 1, "'some_new_field' has no PaddleNLP counterpart"),
])
def test_a_field_without_counterpart_is_named_unless_forced(family, field, value, words):
    hf = dict(CASES[family][0], **{field: value})
    with pytest.raises(UserError) as info:
        translate_config(hf, target="paddlenlp")
    assert "pass --force" in info.value.message
    assert any(words in d for d in info.value.details), info.value.details
    forced = translate_config(hf, force=True, target="paddlenlp")
    if field != "architectures":
        assert forced.config[field] == value  # copied unchanged
    assert any(n.startswith("--force: ") for n in forced.notes)


def test_deberta_conv_act_left_to_hf_default_is_an_error():
    """HF's default after the conv layer is tanh; PaddleNLP always applies GELU (a difference of 0.83)."""
    hf = {k: v for k, v in CASES["deberta-v2"][0].items() if k != "conv_act"}
    with pytest.raises(UserError) as info:
        translate_config(hf)
    assert any("'conv_act' is not given" in d for d in info.value.details)


def test_gpt2_embedding_dropout_must_match_the_residual_one():
    hf = dict(CASES["gpt2"][0], embd_pdrop=0.0)
    with pytest.raises(UserError) as info:
        translate_config(hf)
    assert any("'embd_pdrop'" in d for d in info.value.details)


def test_unknown_model_type_says_what_to_do():
    with pytest.raises(UserError, match="model_type 'whisper' is not one this tool translates .* --mapping"):
        translate_config({"model_type": "whisper"})
