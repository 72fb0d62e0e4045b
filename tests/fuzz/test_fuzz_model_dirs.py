"""Property-based tests of HF model directories: a small BERT directory (pytorch_model.bin,
model.safetensors, or two safetensors shards with their index) whose config.json gets fields of
the wrong type, range, size or depth, odd field names, or is not JSON at all, and whose files are
missing, truncated, emptied, linked, or replaced by a fifo, a device, a directory.

`convert-weights HF_DIR OUT_DIR` must end in exit 0 with the right output (every tensor as the
clean directory converts it, every config field copied as it was given) or in exit 2 with one
`error:` line; never exit 1 or 3, a traceback, a hang; no input changed and nothing left behind."""

import json
import os
import shutil
import stat
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from helpers.hostile_forge import assert_clean_verdict, fuzz_settings, no_leftovers, run_in_process
from helpers.hf_models import BERT, BERT_CONFIG, load_dir

LAYOUTS = ("bin", "safetensors", "sharded")


class Raw:
    """JSON text put into config.json as it is (an integer Python cannot read, NaN, deep nesting)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return f"Raw({self.text[:20]!r}... {len(self.text)} chars)"


JUNK = [None, True, False, 0, -1, 1, 64, 2**31, 2**63, 1.5, 1e-12, "", "64", "gelu", "bert", "a\nb", [], ["BertModel"],
        [["BertModel"]], [1, 2], {}, {"0": "a"}, "x" * 5000,
        Raw("9" * 5000), Raw("-" + "9" * 4400), Raw("123456789012345678901234"), Raw("NaN"), Raw("-Infinity"),
        Raw("1e999"), Raw("[" * 5000 + "]" * 5000), Raw("[" * 70 + "]" * 70), Raw('{"a": ' * 40 + "1" + "}" * 40)]
FIELDS = ["model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "vocab_size", "type_vocab_size", "layer_norm_eps", "hidden_act", "hidden_dropout_prob", "pad_token_id",
          "use_cache", "id2label", "torch_dtype", "position_embedding_type", "tie_word_embeddings",
          "transformers_version", "some_new_field", "n_embd", "bad\nerror: injected", "\x1b[2J", "\ud800", ""]
# what PaddleNLP computes with, when written: the oracle for an exit 0
_size = lambda v: type(v) is int and 0 < v < 2**31
WRITTEN = {**dict.fromkeys(["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                            "vocab_size"], _size),
           "type_vocab_size": lambda v: type(v) is int and 0 <= v < 2**31,
           "layer_norm_eps": lambda v: type(v) in (int, float) and 0 < v < float("inf"),
           "hidden_dropout_prob": lambda v: type(v) in (int, float) and 0 <= v <= 1,
           "hidden_act": lambda v: v in ("gelu", "relu", "tanh", "silu", "sigmoid"),
           "use_cache": lambda v: type(v) is bool, "tie_word_embeddings": lambda v: type(v) is bool,
           "architectures": lambda v: type(v) is list and all(x == "BertModel" for x in v),
           "pad_token_id": lambda v: v is None or type(v) is int,
           "id2label": lambda v: type(v) is dict, "dtype": lambda v: v in (None, "float16", "bfloat16", "float32", "float64")}
WHOLE = ["", "not json", "[1, 2]", '"bert"', "null", "\ufeff{}", '{"model_type": "bert"', "\udcff"]
CONFIG_FILES = ["fifo", "dev_zero", "directory", "dangling", "link", "sparse", "empty"]
WEIGHT_FILES = ["missing", "truncated", "empty", "link", "directory", "appended", "fifo", "dangling"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """One clean model directory per layout, and the tensors the clean bin directory converts to."""
    from helpers.hf_models import hf_state
    root = tmp_path_factory.mktemp("clean")
    state = hf_state(BERT)
    for layout in LAYOUTS:
        path = root / layout
        path.mkdir()
        if layout == "bin":
            torch.save(state, path / "pytorch_model.bin")
        elif layout == "safetensors":
            save_file({k: v.clone() for k, v in state.items()}, str(path / "model.safetensors"))
        else:
            keys, weight_map = sorted(state), {}
            for i, part in enumerate((keys[::2], keys[1::2])):
                name = f"model-{i + 1:05d}-of-00002.safetensors"
                save_file({k: state[k].clone() for k in part}, str(path / name))
                weight_map.update(dict.fromkeys(part, name))
            (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        (path / "config.json").write_text(json.dumps(BERT_CONFIG))
    r = run_in_process(root / "bin", root / "out", "--quiet")
    assert r.code == 0, r
    return root, load_dir(root / "out")


@st.composite
def configs(draw):
    """(config.json's text, the dict it holds or None when it is not a JSON object of plain values)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(WHOLE)), None
    config = dict(BERT_CONFIG)
    raws = {}
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
        name = draw(st.sampled_from(FIELDS if draw(st.booleans()) else sorted(WRITTEN)))
        if draw(st.integers(0, 5)) == 0:
            config.pop(name, None)
            continue
        value = draw(st.sampled_from(JUNK))
        if isinstance(value, Raw):
            raws[f"@raw{len(raws)}@"] = value.text
            value = f"@raw{len(raws) - 1}@"
        config[name] = value
    text = json.dumps(config)
    for marker, raw in raws.items():
        text = text.replace(json.dumps(marker), raw)
    if draw(st.integers(0, 9)) == 0:
        text = text[:draw(st.integers(0, len(text)))]
    return text, (None if raws else config)


def _weight_files(path):
    return sorted(f for f in os.listdir(path) if f != "config.json")


def _damage(path, what: str, name: str, elsewhere, fraction: float) -> None:
    target = path / name
    if what in ("fifo", "dev_zero", "directory", "dangling", "link", "missing"):
        kept = elsewhere / f"{name}.kept"
        if what == "link":
            shutil.copyfile(target, kept)
        target.unlink()
        if what == "fifo":
            os.mkfifo(target)
        elif what == "dev_zero":
            target.symlink_to("/dev/zero")
        elif what == "directory":
            target.mkdir()
        elif what == "dangling":
            target.symlink_to(elsewhere / "nothing")
        elif what == "link":
            target.symlink_to(kept)
    elif what == "sparse":
        with open(target, "r+b") as f:
            f.truncate(3 << 30)
    elif what == "empty":
        target.write_bytes(b"")
    elif what == "truncated":
        with open(target, "r+b") as f:
            f.truncate(int(os.path.getsize(target) * fraction))
    elif what == "appended":
        with open(target, "ab") as f:
            f.write(b"\0junk" * 7)


def _snapshot(*roots) -> dict:
    """Every entry under the roots: its kind, a link's target, a regular file's bytes."""
    seen = {}
    for root in roots:
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                seen[path] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                with open(path, "rb") as f:
                    seen[path] = ("file", os.fstat(f.fileno()).st_size, f.read(1 << 20))
            else:
                seen[path] = ("other", stat.S_IFMT(mode))
    return seen


def _check_output(out, config: dict, expected: dict) -> None:
    got = load_dir(out)
    assert sorted(got) == sorted(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "bert"
    for name, test in WRITTEN.items():  # what PaddleNLP's BertConfig computes with
        assert name not in written or test(written[name]), (name, written[name])
    for name, value in written.items():  # bert's fields keep their names; what was copied is what was given
        if name in config and name not in ("model_type", "architectures"):
            assert json.dumps(value) == json.dumps(config[name]), name


@settings(fuzz_settings(100), phases=[Phase.explicit, Phase.generate, Phase.shrink])
@given(layout=st.sampled_from(LAYOUTS), config=configs(), force=st.booleans(),
       damage=st.one_of(st.just([]), st.lists(st.tuples(st.sampled_from(["config", "weights"]), st.integers(0, 7),
                                                        st.floats(0, 1, allow_nan=False)), min_size=1, max_size=2)))
@pytest.mark.slow
def test_fuzz_model_directories(clean, layout, config, force, damage):
    root, expected = clean
    text, plain = config
    with tempfile.TemporaryDirectory() as d:
        d = os.path.realpath(d)
        src, elsewhere, out = os.path.join(d, "hf"), os.path.join(d, "elsewhere"), os.path.join(d, "out")
        shutil.copytree(root / layout, src)
        os.mkdir(elsewhere)
        with open(os.path.join(src, "config.json"), "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
        from pathlib import Path
        src, elsewhere, out = Path(src), Path(elsewhere), Path(out)
        for part, which, fraction in damage:
            names = ["config.json"] if part == "config" else _weight_files(src)
            name = names[which % len(names)] if names else None
            if name is None or not os.path.isfile(src / name) or os.path.islink(src / name):  # damaged already
                continue
            what = (CONFIG_FILES if part == "config" else WEIGHT_FILES)[which % (7 if part == "config" else 8)]
            event(f"{part}: {what}")
            _damage(src, what, name, elsewhere, fraction)
            if what not in ("link", "appended") and not (what == "truncated" and fraction == 1):
                plain = None if part == "config" else plain
        before = _snapshot(src, elsewhere)
        r = run_in_process(src, out, "--quiet", *(["--force"] if force else []), seconds=20)
        event(f"exit {r.code}")
        assert_clean_verdict(r)
        assert all(line.startswith(("error: ", "note: ", "mapping: ", "  ", "converted ")) for line in r.stderr.splitlines()), r
        assert _snapshot(src, elsewhere) == before
        assert no_leftovers(d) == []
        if r.code == 2:
            assert not os.path.exists(out)
        else:
            assert plain is not None or text.startswith("{"), r
            _check_output(out, plain if plain is not None else json.loads(text), expected)
