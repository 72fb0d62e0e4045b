"""Loaded by every test: it imports neither torch nor paddle (tests/helpers has the helpers; a test
imports a framework itself, where it needs one)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("GLOG_minloglevel", "2")  # paddle's set-up notes, as converter.lazy.import_paddle keeps them quiet


@pytest.fixture
def tmp(tmp_path):
    return tmp_path
