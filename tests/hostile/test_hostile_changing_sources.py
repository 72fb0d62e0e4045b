"""Sources that change while they are converted (a checkpoint downloaded again meanwhile): exit 2
with one line, never a signal (a memory map read past a file's new end dies of SIGBUS), never
an output made of two versions of a file."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from helpers.hostile_forge import ROOT, assert_one_line_error, no_leftovers

KEEP_ALL = {"name": "keep", "rules": [{"kind": "rename", "match": "(.*)", "to": r"\1"}]}
CHANGED = "SRC changed while it was being read"

# convert-weights in a fresh process, with the first tensor read (or copied in the kernel) of the
# file named CHANGE changed by HOW first: after the file was opened and its header or zip directory read, as another
# process re-downloading it would, but at a moment chosen deterministically
_RUNNER = """
import os, sys
sys.path.insert(0, {root!r})
from converter.io import sink, stable
target, how = os.path.abspath({target!r}), {how!r}
read, copy = stable.StableFile.array, sink.copy_range
done = []

def change(self):
    if os.path.abspath(self.path) == target and not done:
        done.append(1)
        if how == "truncate":
            os.truncate(target, self.size // 2)
        elif how == "rewrite":
            with open(target, "r+b") as f:
                f.seek(self.size - 8)
                f.write(b"\\x7f" * 8)
            os.utime(target, ns=(self.identity[3] + 10**9, self.identity[3] + 10**9))
        elif how == "rewrite, time set back":  # as touch -r or rsync --inplace -t leave it
            with open(target, "r+b") as f:
                f.seek(self.size - 8)
                f.write(b"\x7f" * 8)
            os.utime(target, ns=(self.identity[3], self.identity[3]))
        elif how == "replace":
            os.rename(target + ".other", target)

def array(self, *args):
    change(self)
    return read(self, *args)

def copied(src, *args):  # a tensor copied from file to file in the kernel, never read into the process
    change(src)
    return copy(src, *args)

stable.StableFile.array = array
sink.copy_range = copied
from converter.cli import convert_weights
convert_weights(sys.argv[1:], prog_name="convert-weights")
"""


class Run:
    def __init__(self, p):
        self.code, self.stdout, self.stderr = p.returncode, p.stdout, p.stderr

    def __repr__(self):
        return f"exit {self.code}\nstdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}"


def _convert_changing(target, how, *args) -> Run:
    code = _RUNNER.format(root=ROOT, target=str(target), how=how)
    return Run(subprocess.run([sys.executable, "-c", code] + [str(a) for a in args], capture_output=True, text=True,
                              timeout=300, cwd=ROOT))


def _state(n=6, size=256):
    rng = np.random.default_rng(0)
    return {f"layer{i}.weight": rng.standard_normal((size, size), dtype=np.float32) for i in range(n)}


def _rules(tmp):
    (tmp / "rules.json").write_text(json.dumps(KEEP_ALL))
    return tmp / "rules.json"


def _source(tmp, fmt):
    """(path given to convert-weights, file that changes) for a safetensors file, a torch zip, a
    shard of an index."""
    state = _state()
    if fmt == "safetensors":
        save_file(state, str(tmp / "m.safetensors"))
        return tmp / "m.safetensors", tmp / "m.safetensors"
    if fmt == "pdparams":
        import pickle
        (tmp / "m.pdparams").write_bytes(pickle.dumps(state, protocol=4))
        return tmp / "m.pdparams", tmp / "m.pdparams"
    if fmt == "torch.load zip":  # a name the plain reader does not know (torch.Size): torch.load maps it
        tensors = {k: torch.from_numpy(v) for k, v in state.items()}
        torch.save({"model": tensors, "shape": torch.Size([2, 3])}, str(tmp / "m.pt"))
        return tmp / "m.pt", tmp / "m.pt"
    if fmt == "torch zip":
        torch.save({k: torch.from_numpy(v) for k, v in state.items()}, str(tmp / "m.pt"))
        return tmp / "m.pt", tmp / "m.pt"
    keys = sorted(state)
    save_file({k: state[k] for k in keys[:3]}, str(tmp / "model-00001-of-00002.safetensors"))
    save_file({k: state[k] for k in keys[3:]}, str(tmp / "model-00002-of-00002.safetensors"))
    weight_map = {k: f"model-0000{1 + (i >= 3)}-of-00002.safetensors" for i, k in enumerate(keys)}
    (tmp / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp / "model.safetensors.index.json", tmp / "model-00002-of-00002.safetensors"


FORMATS = ["safetensors", "torch zip", "torch.load zip", "shard", "pdparams"]


@pytest.mark.parametrize("out", ["o.pdparams", "o.safetensors"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.slow
def test_a_source_truncated_while_it_is_read_is_one_line(tmp, fmt, out):
    """SIGBUS (exit -7) before: the memory map read past the file's new end."""
    src, changing = _source(tmp, fmt)
    r = _convert_changing(changing, "truncate", src, tmp / out, "--mapping", _rules(tmp))
    assert_one_line_error(r, CHANGED, changing.name, "bytes now")
    assert not (tmp / out).exists() and not no_leftovers(tmp)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.slow
def test_a_source_rewritten_in_place_while_it_is_read_is_one_line(tmp, fmt):
    """Same size, other bytes, a later time: the output would mix two versions of the file."""
    src, changing = _source(tmp, fmt)
    r = _convert_changing(changing, "rewrite", src, tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, CHANGED, changing.name)
    assert not (tmp / "o.pdparams").exists()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.slow
def test_a_source_rewritten_in_place_with_its_time_set_back_is_one_line(tmp, fmt):
    """Same size, other bytes, the modification time it had: only the status change time
    tells (exit 0 before, with an output that mixed the two versions)."""
    src, changing = _source(tmp, fmt)
    r = _convert_changing(changing, "rewrite, time set back", src, tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, CHANGED, changing.name, "was written to")
    assert not (tmp / "o.pdparams").exists() and not no_leftovers(tmp)


@pytest.mark.slow


def test_a_source_replaced_while_it_is_read_is_one_line(tmp):
    src, changing = _source(tmp, "safetensors")
    save_file({k: v + 1 for k, v in _state().items()}, str(tmp / "m.safetensors.other"))
    r = _convert_changing(changing, "replace", src, tmp / "o.pdparams", "--mapping", _rules(tmp))
    assert_one_line_error(r, CHANGED, "replaced by another file")
    assert not (tmp / "o.pdparams").exists()


@pytest.mark.parametrize("fmt", ["safetensors", "torch zip"])
@pytest.mark.slow
def test_a_source_truncated_by_another_process_during_a_conversion_never_kills_it(tmp, fmt):
    """The real race: another process truncates the file at several moments of a conversion.
    Each run ends in exit 0 (it finished first, with the whole file) or exit 2 with one line."""
    state = _state(n=16, size=1024)  # 64 MiB
    rules = _rules(tmp)
    outcomes = []
    for delay in (0.0, 0.3, 0.6, 0.9, 1.2, 1.6):
        src = tmp / ("m.safetensors" if fmt == "safetensors" else "m.pt")
        if fmt == "safetensors":
            save_file(state, str(src))
        else:
            torch.save({k: torch.from_numpy(v) for k, v in state.items()}, str(src))
        out = tmp / "o.pdparams"
        if out.exists():
            out.unlink()
        p = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                              "from converter.cli import convert_weights; "
                              "convert_weights(sys.argv[1:], prog_name='convert-weights')", ROOT, str(src), str(out),
                              "--mapping", str(rules), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT)
        time.sleep(delay)
        os.truncate(src, os.path.getsize(src) // 3)
        stdout, stderr = p.communicate(timeout=300)
        r = Run(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
        assert r.code in (0, 2), r  # never -7 (SIGBUS) nor 3
        if r.code == 2:
            assert_one_line_error(r)
            assert CHANGED in r.stderr or "truncated" in r.stderr, r  # truncated before it was opened: a short file
            assert not out.exists() and not no_leftovers(tmp)
        outcomes.append(r.code)
    assert 2 in outcomes, outcomes  # at least one truncation came while the file was being read


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.slow
def test_a_model_directory_whose_weights_change_while_they_are_read_is_one_line(tmp, shards):
    """HF_DIR OUT_DIR: a .bin or a shard truncated after it was opened; no OUT_DIR is left."""
    from helpers.hf_models import BERT, hf_dir, hf_state
    src = hf_dir(tmp / "hf", hf_state(BERT), shards=shards)
    changing = src / ("pytorch_model.bin" if shards == 1 else "model-00002-of-00002.safetensors")
    r = _convert_changing(changing, "truncate", src, tmp / "out")
    assert_one_line_error(r, CHANGED, changing.name)
    assert sorted(os.listdir(tmp)) == ["hf"]


@pytest.mark.parametrize("kept", [0.33, 0.9, "inside the last storage's header"])
def test_a_torch_zip_truncated_between_two_tensors_of_the_check_is_said_as_changed(tmp, kept):
    """The self-check's second decoding of a torch zip reads each member's header as it goes: a
    file truncated after its first tensor was checked (its later storages cut short, or their
    headers and the directory gone) is refused as changed, not an internal error."""
    from converter.errors import UserError
    from converter.io import open_source
    state = _state()
    src = tmp / "m.pt"
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, str(src))
    names = list(state)
    with open_source(str(src)) as source:
        assert np.array_equal(source.reference(names[0]), state[names[0]])
        if isinstance(kept, str):
            import zipfile
            with zipfile.ZipFile(src) as archive:
                cut = max(i.header_offset for i in archive.infolist() if "/data/" in i.filename) + 10
        else:
            cut = int(os.path.getsize(src) * kept)
        os.truncate(src, cut)
        with pytest.raises(UserError) as refused:
            for name in names[1:]:
                source.reference(name)
    assert CHANGED in str(refused.value) and "bytes now" in str(refused.value), refused.value
