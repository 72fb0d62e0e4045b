"""Detection where a set names every key but needs a config field the weights alone do not hold (a
merge by groups): its layout is still known, it is said beside the set used, and where no set fits, a
set laying some tensor out otherwise than a set that leaves fewer of its rules unused is never
offered as the closest. Rule files and key shapes only (PaddleFormers' real sets on real HF files:
tests/real_models_paddleformers/test_detect_files.py)."""

import json

import pytest

from converter.errors import UserError
from converter.io.base import TensorInfo
from converter.rules.detect import detect

KEYS = {"attn.q.weight": (8, 4), "attn.k.weight": (8, 4), "mlp.v.weight": (6, 4), "mlp.u.weight": (6, 4),
        "router.weight": (3, 4)}
Q_K = ["attn\\.q\\.weight", "attn\\.k\\.weight"]
V_U = ["mlp\\.v\\.weight", "mlp\\.u\\.weight"]


def _infos():
    return {k: TensorInfo(k, "float32", s) for k, s in KEYS.items()}


def _rule_file(tmp_path, name, rules):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"name": name, "rules": rules}))
    return str(path)


def _transposed(tmp_path, name="router-transposed", v_u_groups="kv"):
    """Every key used; the router transposed; both merges by groups named in the config."""
    return _rule_file(tmp_path, name, [
        {"kind": "merge", "match": Q_K, "to": "attn.qk.weight", "axis": 0, "groups": "heads"},
        {"kind": "merge", "match": V_U, "to": "mlp.vu.weight", "axis": 0, **({"groups": v_u_groups} if v_u_groups else {})},
        {"kind": "rename", "key": "router.weight", "to": "router.weight"},
        {"kind": "transpose", "match": "router\\.weight"}])


def _kept(tmp_path):
    """One merge by groups (one problem without the config); the router kept; two rules for tensors
    this checkpoint does not hold."""
    return _rule_file(tmp_path, "router-kept", [
        {"kind": "merge", "match": Q_K, "to": "attn.qk.weight", "axis": 0, "groups": "heads"},
        {"kind": "merge", "match": V_U, "to": "mlp.vu.weight", "axis": 0},
        {"kind": "rename", "key": "router.weight", "to": "router.weight"},
        {"kind": "rename", "match": "router\\.(?P<x>e_score_correction_bias)", "to": "router.\\g<x>"},
        {"kind": "rename", "match": "shared\\.(?P<x>.*)", "to": "shared.\\g<x>"}])


def _plain(tmp_path):
    """Every key renamed as it is: a plan that needs no config field."""
    return _rule_file(tmp_path, "plain", [{"kind": "rename", "match": "(?P<x>.*)", "to": "\\g<x>"}])


def test_a_set_that_needs_a_config_field_is_said_beside_the_one_used(tmp_path):
    found = detect(_infos(), names=[_plain(tmp_path), _transposed(tmp_path, v_u_groups=None)])
    assert found.chosen.name == "plain" and not found.also_fit
    assert found.with_config == [(["router-transposed"], ["heads"])]
    line = found.describe(len(KEYS))
    assert ("'router-transposed' names every key too, but writes another file and needs the config field 'heads', "
            "which the weights alone do not hold ('plain' is used: its plan needs no config field)") in line, line


def test_sets_needing_config_that_would_write_one_file_are_said_together(tmp_path):
    found = detect(_infos(), names=[_plain(tmp_path), _transposed(tmp_path, "a"), _transposed(tmp_path, "b")])
    assert found.with_config == [(["a", "b"], ["heads", "kv"])]
    assert "'a', 'b' (one file between them) name every key too" in found.describe(len(KEYS))


def test_given_the_config_field_the_set_fits(tmp_path):
    found = detect(_infos(), names=[_transposed(tmp_path, v_u_groups=None)], params={"heads": 2})
    assert found.chosen.name == "router-transposed" and not found.with_config


def test_a_set_laying_a_tensor_out_otherwise_than_one_fitting_more_fully_is_not_offered(tmp_path):
    """'router-kept' has fewer problems (one field missing, not two) but two rules that find nothing
    here, and keeps the router [3, 4] where 'router-transposed', all of whose rules find a tensor,
    writes [4, 3]: both cannot be right, and the one describing the checkpoint more fully is offered."""
    with pytest.raises(UserError) as raised:
        detect(_infos(), names=[_kept(tmp_path), _transposed(tmp_path)])
    message = raised.value.message
    assert message.startswith("no shipped mapping fits this checkpoint: the closest, 'router-transposed', names every "
                              "key but its plan has 2 problem(s)"), message
    assert ("'router-kept' names every key too but lays 'router.weight' out as [3, 4] where 'router-transposed' lays "
            "it out as [4, 3] transposed, and 2 of its rules find no tensor here (0 of 'router-transposed's): not "
            "offered") in message, message


def test_without_a_rival_laying_it_out_otherwise_the_closest_is_the_one_with_fewest_problems(tmp_path):
    with pytest.raises(UserError) as raised:
        detect(_infos(), names=[_kept(tmp_path)])
    assert "the closest, 'router-kept', names every key but its plan has 1 problem(s);" in raised.value.message
