"""Outputs against inputs and against what is already there: an output never is, lies in or
contains an input (links and hard links resolved), replaces nothing but a regular file (or an
OUT_DIR this tool wrote), the outputs of a run appear together or not at all, and a directory
commit never loses both the old and the new directory."""

import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

from helpers.cli import ROOT, run_convert, run_verify, spec_path
from helpers.hostile_forge import assert_one_line_error, fuzz_settings, no_leftovers
from helpers.hf_models import BERT, hf_dir, hf_state, load_dir

KEEP_ALL = [{"kind": "rename", "match": "(.*)", "to": r"\1"}]


def snapshot(*roots) -> dict:
    """Every entry under `roots` (not through links): its kind and its bytes or link target."""
    seen = {}
    for root in map(str, roots):
        entries = [root] if not os.path.isdir(root) or os.path.islink(root) else []
        for top, dirs, files in os.walk(root):
            entries += [os.path.join(top, n) for n in dirs + files]
            seen[top] = "dir"
        for path in entries:
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                seen[path] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                with open(path, "rb") as f:
                    seen[path] = ("file", f.read())
            elif not stat.S_ISDIR(mode):
                seen[path] = ("other", stat.S_IFMT(mode))
    return seen


@pytest.fixture
def hf(tmp):
    (tmp / "top" / "mid").mkdir(parents=True)
    return hf_dir(tmp / "top" / "mid" / "hf", hf_state(BERT))


@pytest.fixture
def ckpt(tmp):
    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, str(tmp / "m.safetensors"))
    (tmp / "rules.json").write_text(json.dumps({"name": "keep", "rules": KEEP_ALL}))
    return tmp / "m.safetensors", tmp / "rules.json"


def tool_written(path):
    """A directory as an earlier conversion leaves it."""
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model_state.pdparams").write_bytes(b"earlier")
    return path


# ---- OUT_DIR against HF_DIR


@pytest.mark.parametrize("up", [1, 2])
def test_out_dir_that_holds_hf_dir_is_refused_even_with_force(tmp, hf, up):
    before = snapshot(tmp)
    out = hf.parents[up - 1]
    r = run_convert(hf, out, "--force", "--quiet")
    assert_one_line_error(r, "contains the input")
    assert snapshot(tmp) == before


def test_out_dir_that_is_a_link_to_hf_dir_is_refused(tmp, hf):
    os.symlink(hf, tmp / "link")
    before = snapshot(tmp)
    r = run_convert(hf, tmp / "link", "--force", "--quiet")
    assert_one_line_error(r, "symbolic link")
    assert snapshot(tmp) == before


def test_out_dir_inside_hf_dir_is_refused(tmp, hf):
    before = snapshot(tmp)
    r = run_convert(hf, hf / "paddle", "--quiet")
    assert_one_line_error(r, "inside the input directory")
    assert snapshot(tmp) == before


@pytest.mark.parametrize("name", ["config.json", "pytorch_model.bin", "report.json"])
def test_json_inside_hf_dir_is_refused(tmp, hf, name):
    before = snapshot(tmp)
    r = run_convert(hf, tmp / "out", "--json", hf / name, "--force", "--quiet")
    assert_one_line_error(r, "--json")
    assert snapshot(tmp) == before


def test_mapping_inside_the_out_dir_force_replaces_is_refused(tmp, hf):
    out = tool_written(tmp / "out")
    rules = out / "config.json"  # a rule file by a name OUT_DIR may hold
    rules.write_text(json.dumps({"name": "keep", "rules": KEEP_ALL}))
    before = snapshot(tmp)
    r = run_convert(hf, out, "--mapping", rules, "--force", "--quiet")
    assert_one_line_error(r, "contains the input")
    assert snapshot(tmp) == before


def test_json_inside_the_out_dir_is_refused(tmp, hf):
    out = tool_written(tmp / "out")
    before = snapshot(tmp)
    r = run_convert(hf, out, "--json", out / "report.json", "--force", "--quiet")
    assert_one_line_error(r, "inside OUT_DIR")
    assert snapshot(tmp) == before


def test_out_dir_holding_a_hard_link_to_an_input_is_refused(tmp, hf, ckpt):
    _, rules = ckpt
    out = tool_written(tmp / "out")
    (out / "config.json").unlink()
    os.link(rules, out / "config.json")
    before = snapshot(tmp)
    r = run_convert(hf, out, "--mapping", rules, "--force", "--quiet")
    assert_one_line_error(r, "hard link")
    assert snapshot(tmp) == before


@pytest.mark.slow


def test_force_replaces_an_out_dir_this_tool_wrote_and_nothing_else(tmp, hf):
    assert run_convert(hf, tmp / "out", "--quiet").code == 0
    first = snapshot(tmp / "out")
    assert run_convert(hf, tmp / "out", "--force", "--quiet", "--dtype", "float16").code == 0
    assert snapshot(tmp / "out") != first
    assert {str(a.dtype) for a in load_dir(tmp / "out").values()} == {"float16"}
    assert sorted(os.listdir(tmp)) == ["out", "top"]  # nothing hidden left beside it
    (tmp / "out" / "notes.txt").write_text("mine")
    before = snapshot(tmp)
    r = run_convert(hf, tmp / "out", "--force", "--quiet")
    assert_one_line_error(r, "notes.txt", "does not write")
    assert snapshot(tmp) == before


# ---- what is not a regular file


def _fifo(path):
    os.mkfifo(path)
    return path


def _socket(path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


@pytest.mark.parametrize("make,option", [(make, option) for make in ["fifo", "socket", "link to /dev/null",
                                                                      "link to a fifo", "/dev/null"]
                                         for option in ["dst", "--json", "--emit-mapping"]
                                         if (make, option) != ("/dev/null", "dst")])  # DST needs a .pdparams name
def test_force_never_replaces_what_is_not_a_regular_file(tmp, ckpt, make, option):
    src, rules = ckpt
    if make == "/dev/null":
        target = "/dev/null"
    elif make == "fifo":
        target = _fifo(tmp / "target")
    elif make == "socket":
        target = _socket(tmp / "target")
    else:
        os.symlink("/dev/null" if make == "link to /dev/null" else _fifo(tmp / "fifo"), tmp / "target")
        target = tmp / "target"
    if option == "dst":
        os.rename(target, tmp / "t.pdparams")
        target = tmp / "t.pdparams"
        args = [src, target]
    else:
        args = [src, tmp / "o.pdparams", option, target]
    before = snapshot(tmp)
    r = run_convert(*args, "--mapping", rules, "--force")
    assert_one_line_error(r, "regular file")
    assert snapshot(tmp) == before
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("target", ["/dev/null", "/dev/stdout"])
def test_verify_port_never_replaces_a_device(target):
    mode = os.lstat(target).st_mode
    r = run_verify("--spec", spec_path("cnn"), "--json", target, "--force")
    assert_one_line_error(r, "--json", "replaces only a regular file")
    assert os.lstat(target).st_mode == mode and stat.S_ISCHR(os.stat("/dev/null").st_mode)


# ---- all or nothing


def test_json_on_a_file_system_that_refuses_writes_leaves_no_dst(tmp, ckpt):
    """sysfs takes no new files, root or not: the report cannot be written, so DST is not either."""
    src, rules = ckpt
    assert os.path.isdir("/sys") and not os.path.exists("/sys/report.json")
    r = run_convert(src, tmp / "o.pdparams", "--mapping", rules, "--json", "/sys/report.json")
    assert_one_line_error(r)
    assert sorted(os.listdir(tmp)) == ["m.safetensors", "rules.json"]


def test_json_on_a_file_system_that_refuses_writes_leaves_no_out_dir(tmp, hf):
    r = run_convert(hf, tmp / "out", "--json", "/sys/report.json", "--quiet")
    assert_one_line_error(r)
    assert sorted(os.listdir(tmp)) == ["top"]


@pytest.fixture
def full_disk(tmp):
    """A 4 KiB tmpfs already full: an open succeeds, the first flush fails with ENOSPC."""
    (tmp / "full").mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(tmp / "full")],
                      capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs privileges this machine does not give")
    (tmp / "full" / "fill").write_bytes(b"\0" * 4096)
    yield tmp / "full"
    subprocess.run(["umount", str(tmp / "full")], check=True)


def test_json_on_a_full_disk_leaves_no_hidden_out_dir(tmp, hf, full_disk):
    """The report's buffer cannot be flushed, neither at its sync nor when it is closed: the
    hidden OUT_DIR written beside it is removed all the same."""
    r = run_convert(hf, tmp / "out", "--json", full_disk / "r.json", "--quiet")
    assert_one_line_error(r, "No space left on device")
    assert "()" not in r.stderr
    assert sorted(os.listdir(tmp)) == ["full", "top"]
    assert sorted(os.listdir(full_disk)) == ["fill"]


def test_emit_mapping_is_not_written_before_a_conversion_that_fails(tmp, ckpt):
    src, _ = ckpt
    save_file({"w": torch.ones(2), "extra": torch.ones(3)}, str(src))
    (tmp / "some.json").write_text(json.dumps({"name": "some", "rules": [
        {"kind": "rename", "match": "w", "to": "w"}]}))
    r = run_convert(src, tmp / "o.pdparams", "--mapping", tmp / "some.json", "--emit-mapping", tmp / "used.json")
    assert_one_line_error(r, "extra")
    assert not (tmp / "used.json").exists() and not (tmp / "o.pdparams").exists()


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("failing", [0, 1, 2])
def test_a_group_whose_commit_fails_takes_back_those_already_named(tmp, force, failing):
    """The name of one output is taken by another process after the check (without --force), or
    by a directory (with --force, which replaces only a regular file): that commit fails, those
    committed before it are taken back, and files --force replaced are as they were."""
    from converter.errors import UserError
    from converter.io.atomic import OutputGroup
    paths = [tmp / "a.json", tmp / "b.pdparams", tmp / "c.html"]
    if force:
        for p in paths:
            p.write_text(f"old {p.name}")
    before = snapshot(tmp)
    with pytest.raises(UserError):
        with OutputGroup(force) as outputs:
            for p in paths:
                outputs.file(str(p)).file.write(b"new")
            if force:
                paths[failing].unlink()
                paths[failing].mkdir()
            else:
                paths[failing].write_text("someone else's")
    after = snapshot(tmp)
    if force:
        paths[failing].rmdir()
        paths[failing].write_text(f"old {paths[failing].name}")
    else:
        paths[failing].unlink()
    assert snapshot(tmp) == before, after
    assert no_leftovers(tmp) == [] and not [n for n in os.listdir(tmp) if n.startswith(".")]


def test_a_group_commits_every_output_and_removes_what_it_replaced(tmp):
    from converter.io.atomic import OutputGroup
    (tmp / "a.txt").write_text("old")
    os.link(tmp / "a.txt", tmp / "keep.txt")  # another name of the replaced file keeps its bytes
    with OutputGroup(force=True) as outputs:
        outputs.file(str(tmp / "a.txt")).file.write(b"new a")
        outputs.file(str(tmp / "b.txt")).file.write(b"new b")
        staged = outputs.directory(str(tmp / "d"), lambda d: None).staging
        (tmp / staged / "x").write_text("in d")
    assert (tmp / "a.txt").read_text() == "new a" and (tmp / "b.txt").read_text() == "new b"
    assert (tmp / "d" / "x").read_text() == "in d" and (tmp / "keep.txt").read_text() == "old"
    assert sorted(os.listdir(tmp)) == ["a.txt", "b.txt", "d", "keep.txt"]


# ---- directory commits


def test_exchange_leaves_both_names(tmp):
    from converter.io.atomic import _exchange
    (tmp / "a").mkdir()
    (tmp / "a" / "x").write_text("a")
    (tmp / "b").mkdir()
    (tmp / "b" / "y").write_text("b")
    assert _exchange(str(tmp / "a"), str(tmp / "b")), "this kernel and file system have RENAME_EXCHANGE"
    assert os.listdir(tmp / "a") == ["y"] and os.listdir(tmp / "b") == ["x"]


_COMMIT_LOOP = """
import os, sys
sys.path.insert(0, {root!r})
from converter.io import atomic
if {without_exchange!r}:
    atomic._exchange = lambda a, b: False  # as on a file system without RENAME_EXCHANGE
dst = {dst!r}
i = 0
while True:
    i += 1
    with atomic.OutputGroup(force=True) as outputs:
        staged = outputs.directory(dst, lambda d: None).staging
        for name in ("a", "b"):
            with open(os.path.join(staged, name), "w") as f:
                f.write(str(i) * 1000)
"""


@pytest.mark.parametrize("without_exchange", [False, True])
@pytest.mark.slow
def test_a_directory_replace_killed_at_any_moment_loses_neither(tmp, without_exchange):
    """SIGKILL a process that replaces a directory over and over: afterwards OUT_DIR is whole (the
    old or the new one), or (where RENAME_EXCHANGE is missing, killed between the two renames)
    the next run moves the old one back; then nothing hidden is left."""
    from converter.io.atomic import remove_stale_temporaries
    dst = tmp / "out"
    dst.mkdir()
    for name in ("a", "b"):
        (dst / name).write_text("0" * 1000)
    rng = random.Random(7)
    script = _COMMIT_LOOP.format(root=ROOT, dst=str(dst), without_exchange=without_exchange)
    for _ in range(6):
        p = subprocess.Popen([sys.executable, "-c", script])
        time.sleep(0.6 + rng.random() * 0.3)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if without_exchange or dst.exists():
            remove_stale_temporaries(str(dst))
        assert dst.is_dir()
        a, b = (dst / "a").read_text(), (dst / "b").read_text()
        assert a == b and len(a) >= 1000
        assert sorted(os.listdir(tmp)) == ["out"]


_CREATE = """
import os, sys, time
sys.path.insert(0, {root!r})
from converter.io import atomic
from converter.errors import UserError
start = float(sys.argv[1])
try:
    with atomic.OutputGroup(force=False) as outputs:
        staged = outputs.directory({dst!r}, lambda d: None).staging
        open(os.path.join(staged, "who"), "w").write(str(os.getpid()))
        time.sleep(max(0.0, start - time.time()))
except UserError as exc:
    print(exc.message)
    sys.exit(2)
"""


@pytest.mark.slow


def test_of_runs_at_once_into_a_new_directory_exactly_one_creates_it(tmp):
    script = _CREATE.format(root=ROOT, dst=str(tmp / "out"))
    start = time.time() + 2.0
    runs = [subprocess.Popen([sys.executable, "-c", script, str(start)], stdout=subprocess.PIPE, text=True)
            for _ in range(4)]
    codes = [p.wait() for p in runs]
    assert sorted(codes) == [0, 2, 2, 2], codes
    winner = runs[codes.index(0)].pid
    assert (tmp / "out" / "who").read_text() == str(winner)
    assert sorted(os.listdir(tmp)) == ["out"]
    said = [p.stdout.read() for p, c in zip(runs, codes) if c == 2]  # at the commit, or at the start if late
    assert all("appeared while this ran" in s or "already exists" in s for s in said), said


@pytest.mark.slow


def test_convert_weights_runs_at_once_into_a_new_out_dir(tmp, hf):
    runs = [subprocess.Popen(["convert-weights", str(hf), str(tmp / "out"), "--quiet"], stderr=subprocess.PIPE,
                             text=True, cwd=ROOT) for _ in range(4)]
    codes = [p.wait(timeout=300) for p in runs]
    assert sorted(codes) == [0, 2, 2, 2], codes
    for p, code in zip(runs, codes):
        err = p.stderr.read()
        if code == 2:
            assert len([x for x in err.splitlines() if x.startswith("error:")]) == 1 and "Traceback" not in err
    assert sorted(os.listdir(tmp / "out")) == ["config.json", "model_state.pdparams"]
    assert sorted(os.listdir(tmp)) == ["out", "top"]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.slow


def test_stale_hidden_directories_of_dead_runs_are_removed(tmp, hf):
    from converter.io.temporaries import _hidden_prefix
    prefix = _hidden_prefix(str(tmp / "out"))
    stale = tmp / f"{prefix}{_dead_pid()}.x1.partial"
    stale.mkdir()
    (stale / "model_state.pdparams").write_bytes(b"half")
    alive = tmp / f"{prefix}{os.getpid()}.x2.partial"
    alive.mkdir()
    r = run_convert(hf, tmp / "out", "--quiet")
    assert r.code == 0, r
    assert not stale.exists() and alive.exists()


# ---- names


@pytest.mark.slow


def test_hf_dir_whose_name_holds_glob_characters(tmp):
    src = hf_dir(tmp / "hf[1]", hf_state(BERT))
    hf_dir(tmp / "hf1", hf_state(BERT))  # what the glob [1] would match instead
    (tmp / "hf1" / "pytorch_model.bin").unlink()
    r = run_convert(src, tmp / "out", "--quiet")
    assert r.code == 0, r
    assert sorted(load_dir(tmp / "out")) == sorted(load_dir_of_single(tmp, src))


def load_dir_of_single(tmp, src):
    assert run_convert(src / "pytorch_model.bin", tmp / "single.pdparams", "--quiet").code == 0
    from converter.io.pdparams import load_pdparams
    return load_pdparams(str(tmp / "single.pdparams"))


@pytest.mark.parametrize("length", [245, 255])
def test_longest_legal_dst_names(tmp, ckpt, length):
    src, rules = ckpt
    name = "d" * (length - len(".pdparams")) + ".pdparams"
    assert len(name.encode()) == length
    assert run_convert(src, tmp / name, "--mapping", rules, "--json", tmp / ("j" * (length - 5) + ".json")).code == 0
    r = run_convert(src, tmp / name, "--mapping", rules, "--force")  # replacing goes through a hidden name
    assert r.code == 0, r
    assert no_leftovers(tmp) == []


@pytest.mark.parametrize("length", [245, 255])
@pytest.mark.slow
def test_longest_legal_out_dir_names(tmp, hf, length):
    out = tmp / ("o" * length)
    assert run_convert(hf, out, "--quiet").code == 0
    r = run_convert(hf, out, "--quiet", "--force")
    assert r.code == 0, r
    assert sorted(os.listdir(out)) == ["config.json", "model_state.pdparams"]
    assert sorted(os.listdir(tmp)) == sorted(["top", out.name])


# ---- random relations between outputs and inputs

RELATIONS = ["new", "same", "hard link", "symlink", "inside input dir", "input dir", "parent", "grandparent",
             "link to input dir", "fifo", "/dev/null", "link to /dev/null", "existing", "tool-written dir",
             "inside other output"]


def _place(relation, world, out, suffix, which):
    """A path for an output that stands in `relation` to the inputs of `world` (to the input
    `which` picks, where the relation is to a file)."""
    hf, rules = world["hf"], world["rules"]
    inputs = [world["file"], rules, hf / "config.json", hf / "pytorch_model.bin"]
    pick = inputs[which % len(inputs)]
    name = out / f"o{len(os.listdir(out))}{suffix}"
    if relation == "same":
        return pick
    if relation == "hard link":
        os.link(pick, name)
    elif relation == "symlink":
        os.symlink(pick, name)
    elif relation == "inside input dir":
        return hf / f"new{suffix}"
    elif relation == "input dir":
        return hf
    elif relation == "parent":
        return hf.parent
    elif relation == "grandparent":
        return hf.parent.parent
    elif relation == "link to input dir":
        os.symlink(hf, name)
    elif relation == "fifo":
        os.mkfifo(name)
    elif relation == "/dev/null":
        return "/dev/null"
    elif relation == "link to /dev/null":
        os.symlink("/dev/null", name)
    elif relation == "existing":
        name.write_bytes(b"replace me")
    elif relation == "tool-written dir":
        tool_written(name)
    elif relation == "inside other output":
        return world.get("dst", out) / f"in{suffix}"
    return name


@fuzz_settings(80)
@given(directory=st.booleans(), force=st.booleans(), dst_relation=st.sampled_from(RELATIONS),
       json_relation=st.sampled_from(RELATIONS + [None, None, None]),
       mapping_relation=st.sampled_from(RELATIONS + [None, None, None]), which=st.lists(st.integers(0, 3), min_size=3,
                                                                                      max_size=3))
@pytest.mark.slow
def test_outputs_never_change_an_input(tmp, directory, force, dst_relation, json_relation, mapping_relation, which):
    """Any relation of DST (or OUT_DIR), --json and --emit-mapping to the inputs (SRC or HF_DIR and
    its files, the rule file) and to what is already there: exit 0, or exit 2 with one line; no
    input changed, /dev/null still a device, nothing hidden left."""
    import tempfile
    base = tempfile.mkdtemp(dir=tmp)
    from pathlib import Path
    base = Path(base)
    (base / "in" / "mid").mkdir(parents=True)
    hf = hf_dir(base / "in" / "mid" / "hf", hf_state(BERT))
    save_file({"w": torch.ones(2, 3)}, str(base / "in" / "m.safetensors"))
    (base / "in" / "rules.json").write_text(json.dumps({"name": "keep", "rules": KEEP_ALL}))
    out = base / "out"
    out.mkdir()
    world = {"hf": hf, "file": base / "in" / "m.safetensors", "rules": base / "in" / "rules.json"}
    inputs = [hf if directory else world["file"], world["rules"]]  # what this run reads
    before = snapshot(*inputs)
    dst = _place(dst_relation, world, out, "" if directory else ".pdparams", which[0])
    world["dst"] = Path(dst)
    args = [hf if directory else world["file"], dst, "--quiet"]
    if json_relation:
        args += ["--json", _place(json_relation, world, out, ".json", which[1])]
    if mapping_relation and not directory:
        args += ["--emit-mapping", _place(mapping_relation, world, out, ".rules", which[2])]
    args += ["--mapping", world["rules"]]
    if force:
        args.append("--force")
    r = run_convert(*args)
    assert r.code in (0, 2), r
    if r.code == 2:
        assert_one_line_error(r)
    assert snapshot(*inputs) == before, r
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not [n for n in os.listdir(out) + os.listdir(base) if ".partial" in n or n.endswith(".old")]


@pytest.mark.slow


def test_a_run_killed_while_it_writes_leaves_no_hidden_directory_after_the_next(tmp, hf):
    """kill -9 while OUT_DIR is written leaves its hidden directory; the next run removes it."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from converter.io import atomic
        outputs = atomic.OutputGroup()
        outputs.directory({str(tmp / 'out')!r}, lambda d: None)
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", script]).returncode == -signal.SIGKILL
    assert len(no_leftovers(tmp)) == 1
    assert run_convert(hf, tmp / "out", "--quiet").code == 0
    assert no_leftovers(tmp) == []


@pytest.mark.parametrize("suffix", [".pdparams", ".safetensors"])
def test_spec_load_check_reads_the_file_before_it_is_named(tmp, suffix):
    """With --spec the new file is loaded into the paddle model before any output has its name,
    in either format; the JSON written with it holds the check's result."""
    from converter.spec import load_spec
    state = load_spec(spec_path("cnn")).torch_model().state_dict()
    torch.save(state, tmp / "m.pt")
    dst = tmp / f"o{suffix}"
    r = run_convert(tmp / "m.pt", dst, "--spec", spec_path("cnn"), "--json", tmp / "r.json")
    assert r.code == 0, r
    report = json.loads((tmp / "r.json").read_text())
    assert report["missing_keys"] == [] and report["unexpected_keys"] == [] and report["ok"]
    assert sorted(os.listdir(tmp)) == sorted(["m.pt", dst.name, "r.json"])


def test_out_dir_that_is_a_regular_file_is_named_as_a_file(tmp, hf):
    (tmp / "out").write_text("notes")
    r = run_convert(hf, tmp / "out", "--force", "--quiet")
    assert_one_line_error(r, "is a file; a model directory converts into a directory")
    assert (tmp / "out").read_text() == "notes"
