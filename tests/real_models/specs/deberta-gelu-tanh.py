"""Real-model case deberta-gelu-tanh: GELU's tanh form where torch uses the exact one (tests/real_models/cases.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cases  # noqa: E402

CASE = cases.BY_NAME["deberta-gelu-tanh"]
mapping = cases.mapping(CASE)


def torch_model():
    return cases.torch_model(CASE)


def paddle_model():
    return cases.paddle_model(CASE)


def inputs():
    return cases.inputs(CASE)
