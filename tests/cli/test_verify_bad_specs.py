"""verify-port on specs that misbehave: each is exit 2 with one line naming the spec's line,
never a silent exit 0 and never a report that passes."""

import pytest

from helpers.cli import run_verify, spec_path

BASE = open(spec_path("signatures")).read()
TORCH_RETURN = "return self.head(self.norm(h + self.attn(h)))"


def _spec(tmp_path, old, new, name="spec.py"):
    assert old in BASE
    path = tmp_path / name
    path.write_text(BASE.replace(old, new, 1))
    return path


def _line_of(path, text):
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("where,old,new", [
    ("import", "VOCAB, T, B, H, HEADS = 50, 10, 2, 16, 2", "VOCAB, T, B, H, HEADS = 50, 10, 2, 16, 2\nimport sys; sys.exit(0)"),
    ("torch_model", "    torch.manual_seed(0)\n", "    import sys; sys.exit(0)\n"),
    ("forward", TORCH_RETURN, "import sys; sys.exit(0)"),
])
def test_a_spec_that_exits_is_bad_input(tmp_path, where, old, new):
    path = _spec(tmp_path, old, new)
    r = run_verify("--spec", path, "--device", "cpu")
    assert r.code == 2, r
    assert "sys.exit(0)" in r.stderr and f"line {_line_of(path, 'sys.exit(0)')}" in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_forward_that_raises_names_the_spec_line(tmp_path):
    path = _spec(tmp_path, TORCH_RETURN, "raise ValueError('shapes\\nfar off')")
    r = run_verify("--spec", path, "--device", "cpu")
    assert r.code == 2, r
    assert "ValueError: shapes far off" in r.stderr and f"line {_line_of(path, 'raise ValueError')}" in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_randomness_in_the_torch_forward_never_passes(tmp_path, strategy):
    path = _spec(tmp_path, TORCH_RETURN,
                 "return self.head(self.norm(h + torch.nn.functional.dropout(self.attn(h), 0.5, training=True)))")
    r = run_verify("--spec", path, "--device", "cpu", "--strategy", strategy)
    assert r.code == 2, r
    assert "other outputs on the same inputs" in r.stderr and "dropout" in r.stderr, r


@pytest.mark.parametrize("change", ["shape", "dtype"])
def test_converted_file_of_wrong_shape_or_dtype_is_refused_before_loading(tmp_path, change):
    import numpy as np
    from converter.io.pdparams import load_pdparams
    from helpers.cli import run_convert
    spec = spec_path("signatures")
    good = tmp_path / "good.pdparams"
    assert run_convert(_torch_checkpoint(tmp_path), good, "--spec", spec).code == 0
    weights = load_pdparams(str(good))
    key = "head.weight"
    weights[key] = weights[key][:, :-1] if change == "shape" else weights[key].astype(np.float64)
    bad = tmp_path / "bad.pdparams"
    _save_plain(weights, bad)
    r = run_verify("--spec", spec, "--converted", bad, "--device", "cpu")
    assert r.code == 2, r
    assert "head.weight" in r.stderr and "nothing was loaded" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _torch_checkpoint(tmp_path):
    import importlib.util
    import torch
    module_spec = importlib.util.spec_from_file_location("signatures_ckpt", spec_path("signatures"))
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    path = tmp_path / "model.pt"
    torch.save(module.torch_model().state_dict(), path)
    return path


def _save_plain(weights, path):
    import paddle
    paddle.save({k: paddle.to_tensor(v) for k, v in weights.items()}, str(path))


@pytest.mark.parametrize("name", ["spec.txt", "spec", "port.spec.py3"])
def test_a_spec_is_python_whatever_its_suffix(tmp_path, name):
    path = tmp_path / name
    path.write_text(BASE)
    r = run_verify("--spec", path, "--device", "cpu")
    assert r.code == 0 and "PASS" in r.stdout, r
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no bytecode written beside it


def test_a_spec_txt_that_raises_names_its_line(tmp_path):
    path = _spec(tmp_path, "    torch.manual_seed(0)\n", "    raise ValueError('boom')\n", name="spec.txt")
    r = run_verify("--spec", path, "--device", "cpu")
    assert r.code == 2, r
    assert "torch_model() failed with ValueError: boom" in r.stderr, r
    assert f"line {_line_of(path, 'boom')}" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r


def test_a_spec_may_give_its_rules_as_a_dict(tmp_path):
    """A rule file's JSON object as the spec's mapping is read as that rule file would be."""
    path = _spec(tmp_path, "mapping = None", 'mapping = {"name": "inline", "unmatched": "keep", '
                 '"rules": [{"kind": "transpose", "match": "(head|attn\\\\.\\\\w+_proj)\\\\.weight"}]}')
    r = run_verify("--spec", path, "--device", "cpu")
    assert r.code == 0, r
    bad = _spec(tmp_path, "mapping = None", 'mapping = {"rules": [{"kind": "twist"}]}', name="bad.py")
    r = run_verify("--spec", bad, "--device", "cpu")
    assert r.code == 2 and "mapping" in r.stderr and "rule 1" in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_mapping_of_another_type_is_one_line(tmp_path):
    path = _spec(tmp_path, "mapping = None", "mapping = 42")
    r = run_verify("--spec", path, "--device", "cpu")
    assert r.code == 2 and "mapping is a int" in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
