"""Real-model case llama-qk-swapped: the rule file exchanges layer 0's q_proj and k_proj (tests/real_models/cases.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cases  # noqa: E402

CASE = cases.BY_NAME["llama-qk-swapped"]
mapping = cases.mapping(CASE)


def torch_model():
    return cases.torch_model(CASE)


def paddle_model():
    return cases.paddle_model(CASE)


def inputs():
    return cases.inputs(CASE)
