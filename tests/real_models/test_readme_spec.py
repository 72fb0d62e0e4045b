"""The README's HF-to-PaddleNLP spec, run as the README runs it: a tiny HF BertModel saved as HF
saves it, `convert-weights HF_DIR PD_DIR` on the directory, then `verify-port` on the spec taken
from README.md with its two directories pointed at those (the forward check, the `mapping =
"loaded"` variant the README describes, and --train). Each command runs as the installed console
script, in a fresh process. Runs only where transformers and PaddleNLP are installed (the side
environment); elsewhere it is skipped."""

import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

pytest.importorskip("transformers")
pytest.importorskip("paddlenlp")

from families import randomize  # noqa: E402


def _readme_spec() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    (spec,) = [b for b in blocks if re.search(r"^HF_DIR = ", b, re.M) and re.search(r"^PD_DIR = ", b, re.M)]
    return spec


def _pointed_at(spec: str, hf_dir, pd_dir) -> str:
    spec, n = re.subn(r"^HF_DIR = .*$", f"HF_DIR = {str(hf_dir)!r}", spec, flags=re.M)
    spec, m = re.subn(r"^PD_DIR = .*$", f"PD_DIR = {str(pd_dir)!r}", spec, flags=re.M)
    assert n == m == 1
    return spec


def _run(command, *args):
    """An installed console script of the side environment, on this checkout."""
    script = os.path.join(os.path.dirname(sys.executable), command)
    return subprocess.run([script, *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    """A tiny HF BertModel directory and what convert-weights makes of it."""
    import torch
    import transformers
    tmp = tmp_path_factory.mktemp("readme")
    config = transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    randomize(transformers.BertModel(config)).save_pretrained(tmp / "my-bert")
    r = _run("convert-weights", tmp / "my-bert", tmp / "my-bert-paddle", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "mapping: 'bert'" in r.stderr
    return tmp, tmp / "my-bert", tmp / "my-bert-paddle"


def _verify(tmp, spec_text, name, *args):
    spec = tmp / f"{name}.py"
    spec.write_text(spec_text)
    report = tmp / f"{name}.json"
    r = _run("verify-port", "--spec", spec, "--device", "cpu", "--json", report, *args)
    assert os.path.exists(report), f"exit {r.returncode}: {r.stderr[-2000:]}"
    return r, json.loads(report.read_text())


def test_the_readme_spec_passes_on_a_clean_conversion(directories):
    tmp, hf_dir, pd_dir = directories
    r, report = _verify(tmp, _pointed_at(_readme_spec(), hf_dir, pd_dir), "spec", "--bisect")
    assert r.returncode == 0 and report["verdict"] == "pass", r.stdout[-2000:]
    assert len(report["layers"]) > 20 and all(row["within_budget"] is not False for row in report["layers"])


def test_the_readme_spec_names_a_wrong_epsilon_in_the_port(directories):
    """The same spec finds a bug in the paddle model it builds: the check is live."""
    tmp, hf_dir, pd_dir = directories
    spec = _pointed_at(_readme_spec(), hf_dir, pd_dir)
    spec = spec.replace("        return BertModel(config)",
                        "        model = BertModel(config)\n"
                        "    model.encoder.layers[1].norm2._epsilon = 1e-3\n"
                        "    return model")
    assert "_epsilon = 1e-3" in spec
    r, report = _verify(tmp, spec, "epsilon", "--bisect")
    assert r.returncode == 1 and report["first_bad_layer"]["torch"] == "encoder.layer.1.output.LayerNorm"
    assert any("epsilon" in d["cause"] for d in report["diagnosis"])


def test_the_loaded_variant_the_readme_describes_checks_the_converted_files(directories):
    tmp, hf_dir, pd_dir = directories
    spec = _pointed_at(_readme_spec(), hf_dir, pd_dir)
    lazy = re.search(r"^    with paddle\.LazyGuard\(\):.*\n        return BertModel\(config\)\n", spec, re.M)
    assert lazy, "the README's paddle_model() builds BertModel(config) under LazyGuard"
    spec = spec.replace(lazy.group(0), "    return BertModel.from_pretrained(PD_DIR, config=config)\n")
    spec, n = re.subn(r'^mapping = "bert".*$', 'mapping = "loaded"', spec, flags=re.M)
    assert n == 1
    r, report = _verify(tmp, spec, "loaded", "--bisect")
    assert r.returncode == 0 and report["verdict"] == "pass", r.stdout[-2000:]
    assert "loaded weights: all 39 equal to torch's" in r.stdout


def test_the_readme_spec_trains_alike(directories):
    """Weights of order one: the pooler's input gradient, once over budget (ratio 1.15), is judged
    with paddle's own measured error beside torch's."""
    tmp, hf_dir, pd_dir = directories
    r, report = _verify(tmp, _pointed_at(_readme_spec(), hf_dir, pd_dir), "train", "--train", "--steps", "3")
    assert r.returncode == 0, r.stdout[-3000:]
    assert report["train"]["verdict"] == "pass" and len(report["train"]["steps"]) == 3
    backward = [c["ratio"] for c in report["train"]["checks"] if c["phase"] == "backward" and c["ratio"] is not None]
    assert backward and max(backward) < 0.8
