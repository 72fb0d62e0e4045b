"""The rules and config tests import neither torch nor paddle, and neither does what every test
loads (tests/conftest.py, tests/helpers/cli.py): run by pytest in a fresh interpreter, they pass
and leave neither framework in sys.modules."""
import json
import subprocess
import sys

import pytest

from helpers.cli import ROOT

FRAMEWORK_FREE = ["tests/unit/rules/test_config.py",
                  pytest.param("tests/hostile/test_hostile_rules.py", marks=pytest.mark.slow),
                  pytest.param("tests/fuzz/test_fuzz_rules.py", marks=pytest.mark.slow)]

_RUN = """import json, sys
import pytest
rc = pytest.main(sys.argv[1:])
print(json.dumps({"rc": int(rc), "loaded": sorted(m for m in ("torch", "paddle") if m in sys.modules)}))
"""


def _frameworks_after(*args):
    p = subprocess.run([sys.executable, "-c", _RUN, "-q", "-p", "no:cacheprovider", *map(str, args)],
                       capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert p.stdout.strip(), p.stderr[-3000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, p.stdout[-3000:]
    return result["loaded"]


@pytest.mark.slow
@pytest.mark.parametrize("test_file", FRAMEWORK_FREE)
def test_the_rules_and_config_tests_import_neither_framework(test_file):
    assert _frameworks_after(test_file) == []


@pytest.mark.slow
def test_a_test_that_imports_torch_is_seen(tmp_path):
    test = tmp_path / "test_with_torch.py"
    test.write_text("import torch\n\n\ndef test_torch():\n    assert torch.zeros(1).shape == (1,)\n")
    assert _frameworks_after(test) == ["torch"]
