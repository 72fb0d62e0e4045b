"""The Llama-shaped pair of scripts/llama_pair.py 4096 wide, two blocks, 64 tokens, with bf16-valued
weights: a pair whose paddle side drifts further from float64 than torch's on CPU."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import llama_pair as L  # noqa: E402


@pytest.fixture
def wide_shape():
    """llama_pair resized to 4096 wide, two blocks, 64 tokens, while a test runs."""
    before = dict(L.SHAPE)
    L.resize(hidden=4096, layers=2, ffn=2048, heads=32, seq=64)
    yield
    L.SHAPE.update(before)


def bf16_valued():
    """llama_pair's torch model with every weight rounded to a bf16 value (held in float32)."""
    import torch
    model = L.torch_model()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    return model
