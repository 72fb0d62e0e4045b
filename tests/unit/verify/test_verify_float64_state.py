"""The forced float64 pass hands each torch module the recorded call's tensors, widened, and the
float64 model's own state objects (HF 5's DynamicCache with use_cache=True): the recorded one is
the fp32 run's, which its layers have already extended; shared, each layer of the float64 pass
would attend over both runs' positions (here, and in HF's eager attention, its causal mask
then no longer fits the keys: the float64 run fails)."""

import numpy as np
import paddle
import pytest
import torch

from converter.compare.replay import with_own_state
from converter.compare.session import Options
from converter.spec import spec_from_functions
from converter.verify.run import verify

H = 16


class Cache:
    """A per-layer store of the positions seen so far, extended by each call (as HF's DynamicCache)."""

    def __init__(self):
        self.layers = {}

    def update(self, index, x, cat):
        self.layers[index] = cat(self.layers[index], x) if index in self.layers else x
        return self.layers[index]


class TorchBlock(torch.nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index, self.proj = index, torch.nn.Linear(H, H)

    def forward(self, x, cache=None):
        context = cache.update(self.index, x, lambda a, b: torch.cat([a, b], 1))
        n = x.shape[1]  # a causal mask over this call's positions, as HF's eager attention adds one
        mask = torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype), 1)
        return x + self.proj(torch.softmax(x @ context.transpose(1, 2) + mask, -1) @ context)


class TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([TorchBlock(i) for i in range(3)])

    def forward(self, x):
        cache = Cache()
        for block in self.blocks:
            x = block(x, cache=cache)
        return x


class PaddleBlock(paddle.nn.Layer):
    def __init__(self, index, scale=1.0):
        super().__init__()
        self.index, self.proj, self.scale = index, paddle.nn.Linear(H, H), scale

    def forward(self, x, cache=None):
        context = cache.update(self.index, x, lambda a, b: paddle.concat([a, b], 1))
        n = x.shape[1]
        mask = paddle.triu(paddle.full([n, n], float("-inf"), dtype=x.dtype), 1)
        attn = paddle.nn.functional.softmax(paddle.matmul(x, context, transpose_y=True) + mask, -1) @ context
        return x + self.proj(attn) * self.scale


class PaddleModel(paddle.nn.Layer):
    def __init__(self, scale=1.0):
        super().__init__()
        self.blocks = paddle.nn.LayerList([PaddleBlock(i, scale if i == 1 else 1.0) for i in range(3)])

    def forward(self, x):
        cache = Cache()
        for block in self.blocks:
            x = block(x, cache=cache)
        return x


def torch_model():
    torch.manual_seed(0)
    return TorchModel()


def inputs():
    return (np.random.default_rng(0).standard_normal((2, 6, H)).astype(np.float32),)


def test_objects_are_the_passing_models_own_and_tensors_the_recorded_ones():
    recorded, live = Cache(), Cache()
    t, other = torch.ones(2), torch.zeros(2)
    got = with_own_state({"x": t, "cache": recorded, "n": 3, "pair": (recorded, t)},
                         {"x": other, "cache": live, "n": 4, "pair": (live, other)})
    assert got["x"] is t and got["cache"] is live and got["n"] == 3 and got["pair"][0] is live and got["pair"][1] is t
    assert with_own_state((t, recorded), (other,))[1] is recorded  # no counterpart in the live call: as recorded
    assert with_own_state({"cache": recorded}, {"cache": "text"})["cache"] is recorded  # another type


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_model_that_extends_a_cache_passes_clean_and_a_small_scale_is_named(strategy):
    clean = verify(spec_from_functions(torch_model, PaddleModel, inputs), Options(device="cpu", strategy=strategy),
                   bisect=True)
    assert clean.verdict == "pass", [(r.torch, r.ratio, r.note) for r in clean.layers if r.within_budget is False]
    assert clean.outputs.within_budget
    buggy = verify(spec_from_functions(torch_model, lambda: PaddleModel(1 + 1e-4), inputs),
                   Options(device="cpu", strategy=strategy), bisect=True)
    assert buggy.verdict == "fail" and buggy.first_bad.torch == "blocks.1", buggy.first_bad
