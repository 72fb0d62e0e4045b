"""Loaded by every test: it imports neither torch nor paddle (tests/helpers has the helpers; a test
imports a framework itself, where it needs one).

Markers (registered in pyproject.toml, strict):
- slow: the tests that make up most of the suite's time; `-m "not slow"` is the fast subset.
- paddle: set here on every test whose file uses paddle or runs verify-port (which needs it).
- side_env: set here on tests/real_models, tests/real_models_paddleformers and tests/real_ports, which
  need a side environment (scripts/side_env.sh, scripts/side_env_paddleformers.sh,
  scripts/side_env_ports.sh)."""
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("GLOG_minloglevel", "2")  # paddle's set-up notes, as converter.lazy.import_paddle keeps them quiet

# What a test file names when it needs paddle: paddle itself, or verify-port in any of its forms.
_NEEDS_PADDLE = re.compile(r"\bimport paddle\b|\bimport_paddle\b|helpers\.(planted|models|blocks)\b|\brun_verify\b|"
                           r"\bverify_port\b|converter\.(verify|train|compare|examples)\b|\bspec_path\b|\bSPECS\b|"
                           r"\bPortSpec\b|\bspec_from_functions\b")
_SIDE_ENVS = tuple(os.path.join(ROOT, "tests", d) + os.sep for d in ("real_models", "real_models_paddleformers", "real_ports"))


def pytest_collection_modifyitems(items):
    needs_paddle = {}
    for item in items:
        path = str(item.path)
        if path.startswith(_SIDE_ENVS):
            item.add_marker(pytest.mark.side_env)
        if path not in needs_paddle:
            with open(path, encoding="utf-8") as f:
                needs_paddle[path] = bool(_NEEDS_PADDLE.search(f.read()))
        if needs_paddle[path]:
            item.add_marker(pytest.mark.paddle)


@pytest.fixture
def tmp(tmp_path):
    return tmp_path
