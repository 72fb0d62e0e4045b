"""The fields of PADDLE_DIR's config.json that differ from HF_DIR's translation (hf/fields.py), and
which causes they belong to: a number named in the cause by its value, a word alone or as the last
part of a dotted name. No model is built."""

from converter.diagnosis import Diagnosis
from converter.hf.fields import FieldApart, _with_field, fields_apart

BERT = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32, "num_attention_heads": 2,
        "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 64,
        "layer_norm_eps": 1e-12, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "type_vocab_size": 2}


def test_the_fields_apart_are_those_the_translation_gives_otherwise():
    from converter.hf.config import translate_config
    paddle = dict(translate_config(BERT, target="paddlenlp").config)
    assert fields_apart(BERT, paddle, "paddlenlp") == []
    paddle.update(layer_norm_eps=1e-5, hidden_act="relu")
    apart = {a.name: (a.paddle, a.hf) for a in fields_apart(BERT, paddle, "paddlenlp")}
    assert apart == {"layer_norm_eps": (1e-5, 1e-12), "hidden_act": ("relu", "gelu")}


def test_a_cause_names_a_field_by_both_its_values():
    eps, act = FieldApart("layer_norm_eps", 1e-5, 1e-12), FieldApart("hidden_act", "relu", "gelu")
    assert eps.named_by("LayerNorm epsilon differs: torch eps=1e-12, paddle epsilon=1e-05: confirmed")
    assert not eps.named_by("LayerNorm epsilon differs: torch eps=1e-12, paddle epsilon=1e-06")
    assert act.named_by("paddle's encoder.layers.0 holds paddle.nn.functional.relu as its activation; re-run with "
                        "paddle.nn.functional.gelu in its place ...")
    assert not act.named_by("paddle's layer calls paddle.nn.functional.gelu(..., approximate=False)")  # no relu
    d = _with_field(Diagnosis("x", "torch eps=1e-12, paddle epsilon=1e-05", "construct it with epsilon=1e-12", "epsilon"),
                    [eps, act])
    assert d.hint == ("construct it with epsilon=1e-12; in the directories: set layer_norm_eps to 1e-12 in PADDLE_DIR's "
                      "config.json, as HF_DIR's translates (or convert HF_DIR again)")
