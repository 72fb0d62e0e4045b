"""Memory of a conversion: at most two large source tensors in memory at once, as the README's
bound (2 x the largest tensor + 300 MiB) assumes."""

import pytest
import json
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

from helpers.hostile_forge import ROOT

MIB = 1 << 20

# the peak RSS of this process image (VmHWM); getrusage's ru_maxrss would count the pytest process it
# was forked from, which holds torch and paddle
_MEASURED = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from converter.cli import convert_weights\n"
             "try:\n    convert_weights(sys.argv[1:], prog_name='convert-weights')\n"
             "except SystemExit as exit:\n    assert not exit.code, exit.code\n"
             "print('max-rss-kib', next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')))")


@pytest.mark.slow


def test_transposed_tensors_stay_within_two_tensors_and_300_mib(tmp):
    """Three 256 MiB matrices, transposed: the third was produced (a transposed tensor's first slab
    reads all of it) while the check still held the first, 934 MiB against the bound's 812."""
    rng = np.random.default_rng(0)
    side = 8192
    save_file({f"l{i}.weight": rng.standard_normal((side, side), dtype=np.float32) for i in range(3)},
              str(tmp / "m.safetensors"))
    rules = {"name": "t", "rules": [{"kind": "rename", "match": "(.*)", "to": r"\1"}, {"kind": "transpose", "match": ".*"}]}
    (tmp / "rules.json").write_text(json.dumps(rules))
    p = subprocess.run([sys.executable, "-c", _MEASURED, ROOT, str(tmp / "m.safetensors"), str(tmp / "o.pdparams"),
                        "--mapping", str(tmp / "rules.json"), "--quiet"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    peak = int(p.stdout.split("max-rss-kib")[1]) * 1024
    largest = side * side * 4
    assert peak <= 2 * largest + 300 * MIB, f"max RSS {peak / MIB:.0f} MiB against {(2 * largest + 300 * MIB) / MIB:.0f}"
