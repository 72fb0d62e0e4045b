"""A conversion stopped by a signal while its outputs are staged: SIGTERM (a service manager, a
batch system's time limit, `kill`) and SIGHUP (a closed terminal) clean up as SIGINT does: the
hidden `.partial` file or directory removed, nothing committed, one line, and exit 128 + the
signal. SIGTERM left a model directory's staged `.partial` directory behind."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

KEEP_ALL = {"name": "keep", "rules": [{"kind": "rename", "match": "(.*)", "to": r"\1"}]}


def _stopped_while_staged(tmp, src, out, sig):
    """convert-weights SRC OUT, sent `sig` as soon as its hidden staged output appears: (exit code,
    stderr), or None where it finished before the output showed."""
    (tmp / "rules.json").write_text(json.dumps(KEEP_ALL))
    command = [sys.executable, "-c", "from converter.cli import main_convert; main_convert()",
               str(src), str(out), "--mapping", str(tmp / "rules.json"), "--quiet"]
    p = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    try:
        while p.poll() is None and time.monotonic() - start < 120:
            if any(".partial" in name for name in os.listdir(out.parent)):
                p.send_signal(sig)
                break
            time.sleep(0.002)
        err = p.communicate(timeout=120)[1]
    finally:
        if p.poll() is None:
            p.kill()
    return None if p.returncode == 0 else (p.returncode, err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_while_a_model_directory_is_staged_cleans_it_up(tmp, sig):
    """(A weights file is staged unnamed where the system allows, O_TMPFILE: nothing to leave.)"""
    for tensors in (24, 96):  # larger where the first finished before its staged output was seen
        src = tmp / f"hf{tensors}"
        src.mkdir()
        torch.save({f"w{i}": torch.zeros(1 << 20) for i in range(tensors)}, src / "pytorch_model.bin")
        (src / "config.json").write_text(json.dumps({"model_type": "bert"}))
        before = {p.name: p.stat().st_mtime_ns for p in src.iterdir()}
        out = tmp / "out" / "converted"
        shutil.rmtree(out.parent, ignore_errors=True)
        out.parent.mkdir()
        got = _stopped_while_staged(tmp, src, out, sig)
        if got is not None:
            break
    assert got is not None, "the conversion finished before its staged output was seen"
    code, err = got
    said = "interrupted" if sig == signal.SIGINT else f"terminated ({sig.name})"
    assert code == 128 + sig and err == f"{said}; nothing was written\n", (code, err)
    assert os.listdir(tmp / "out") == []  # no .partial left, nothing committed
    assert {p.name: p.stat().st_mtime_ns for p in src.iterdir()} == before
