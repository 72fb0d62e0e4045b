"""Every bad input gets one clear line, exit 2, no traceback and no output file."""

import json
import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

from helpers.cli import run_convert, spec_path


def _state():
    torch.manual_seed(0)
    return {"fc.weight": torch.randn(4, 3), "fc.bias": torch.randn(4)}


def _rules(tmp, rules):
    path = tmp / "rules.json"
    path.write_text(json.dumps({"name": "test", "rules": rules}))
    return path


LINEAR_RULES = [{"kind": "rename", "match": r"fc\.(weight|bias)", "to": r"fc.\1"},
                {"kind": "transpose", "key": "fc.weight"}]


def assert_bad_input(r, out, *words):
    assert r.code == 2, r
    assert "Traceback" not in r.stderr + r.stdout
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith("error: "), r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not os.path.exists(out)
    leftovers = [f for f in os.listdir(os.path.dirname(out)) if ".partial" in f]
    assert not leftovers


def test_missing_file(tmp):
    r = run_convert(tmp / "nope.pt", tmp / "o.pdparams", "--mapping", "bert")
    assert_bad_input(r, tmp / "o.pdparams", "nope.pt", "does not exist")


def test_zero_byte_file(tmp):
    (tmp / "empty.safetensors").write_bytes(b"")
    r = run_convert(tmp / "empty.safetensors", tmp / "o.pdparams", "--mapping", "bert")
    assert_bad_input(r, tmp / "o.pdparams", "empty.safetensors", "0 bytes")


def test_truncated_safetensors(tmp):
    save_file(_state(), str(tmp / "m.safetensors"))
    data = (tmp / "m.safetensors").read_bytes()
    (tmp / "cut.safetensors").write_bytes(data[:-20])
    r = run_convert(tmp / "cut.safetensors", tmp / "o.pdparams", "--mapping", _rules(tmp, LINEAR_RULES))
    assert_bad_input(r, tmp / "o.pdparams", "cut.safetensors", "truncated or corrupt")


def test_corrupt_safetensors_header(tmp):
    (tmp / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    r = run_convert(tmp / "bad.safetensors", tmp / "o.pdparams", "--mapping", _rules(tmp, LINEAR_RULES))
    assert_bad_input(r, tmp / "o.pdparams", "bad.safetensors", "not JSON")


def test_truncated_zip_checkpoint(tmp):
    torch.save(_state(), tmp / "m.pt")
    data = (tmp / "m.pt").read_bytes()
    (tmp / "cut.pt").write_bytes(data[: len(data) // 2])
    r = run_convert(tmp / "cut.pt", tmp / "o.pdparams", "--mapping", _rules(tmp, LINEAR_RULES))
    assert_bad_input(r, tmp / "o.pdparams", "cut.pt", "truncated or corrupt")


def test_index_names_missing_shard(tmp):
    save_file({"fc.weight": _state()["fc.weight"]}, str(tmp / "model-00001-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"fc.weight": "model-00001-of-00002.safetensors",
                                           "fc.bias": "model-00002-of-00002.safetensors"}}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index))
    r = run_convert(tmp / "model.safetensors.index.json", tmp / "o.pdparams", "--mapping", _rules(tmp, LINEAR_RULES))
    assert_bad_input(r, tmp / "o.pdparams", "model-00002-of-00002.safetensors", "do not exist")


def test_unknown_mapping(tmp):
    torch.save(_state(), tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", "no-such-model")
    assert_bad_input(r, tmp / "o.pdparams", "unknown mapping 'no-such-model'", "bert")


def test_unmapped_keys_listed_sorted_with_shapes(tmp):
    state = _state() | {"zz.extra": torch.zeros(2, 5), "aa.extra": torch.zeros(7)}
    torch.save(state, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", _rules(tmp, LINEAR_RULES))
    assert_bad_input(r, tmp / "o.pdparams", "'aa.extra' float32[7]", "'zz.extra' float32[2, 5]")
    assert r.stderr.index("aa.extra") < r.stderr.index("zz.extra")


def test_shape_mismatch_against_paddle_model(tmp):
    from converter.spec import load_spec
    spec = load_spec(spec_path("cnn"))
    state = spec.torch_model().state_dict()
    state["head.weight"] = torch.zeros(4, 8, 3, 3)  # the paddle port has a 1x1 head
    torch.save(state, tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--spec", spec_path("cnn"))
    assert_bad_input(r, tmp / "o.pdparams", "head.weight", "[4, 8, 1, 1]", "[4, 8, 3, 3]")


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("container", ["zip", "raw-pickle"])
def test_malicious_pickle_runs_no_code(tmp, container):
    marker = tmp / "pwned"
    payload = {"fc.weight": torch.zeros(2, 2), "evil": _Exploit(marker)}
    path = tmp / "evil.bin"
    if container == "zip":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    r = run_convert(path, tmp / "o.pdparams", "--mapping", _rules(tmp, LINEAR_RULES))
    assert_bad_input(r, tmp / "o.pdparams", "evil.bin", "refusing to load")
    assert not marker.exists()


def test_malicious_pdparams_is_refused_by_our_reader(tmp):
    from converter.errors import UserError
    from converter.io.pdparams import load_pdparams
    marker = tmp / "pwned"
    (tmp / "evil.pdparams").write_bytes(pickle.dumps({"w": _Exploit(marker)}, protocol=4))
    with pytest.raises(UserError, match="asks to import posix.system|asks to import os.system"):
        load_pdparams(str(tmp / "evil.pdparams"))
    assert not marker.exists()


def test_existing_output_kept_without_force(tmp):
    torch.save(_state(), tmp / "m.pt")
    (tmp / "o.pdparams").write_bytes(b"precious")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", _rules(tmp, LINEAR_RULES))
    assert r.code == 2 and "--force" in r.stderr
    assert (tmp / "o.pdparams").read_bytes() == b"precious"
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", _rules(tmp, LINEAR_RULES), "--force")
    assert r.code == 0, r
    assert (tmp / "o.pdparams").read_bytes() != b"precious"


def test_failed_run_with_force_keeps_old_output(tmp):
    torch.save(_state() | {"stray": torch.zeros(1)}, tmp / "m.pt")
    (tmp / "o.pdparams").write_bytes(b"precious")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping", _rules(tmp, LINEAR_RULES), "--force")
    assert r.code == 2
    assert (tmp / "o.pdparams").read_bytes() == b"precious"


def test_bad_rule_file(tmp):
    torch.save(_state(), tmp / "m.pt")
    r = run_convert(tmp / "m.pt", tmp / "o.pdparams", "--mapping",
                    _rules(tmp, [{"kind": "rename", "match": "fc.(", "to": "x"}]))
    assert_bad_input(r, tmp / "o.pdparams", "rule 1", "bad regular expression")
