"""The comparison statistics and the budget ratio, against float64 computed here directly."""

import math

import numpy as np
import pytest

from converter.compare.budget import LAYER, budget_for
from converter.compare.metrics import compare


def _reference(ref, got):
    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    d = np.abs(g - r)
    return d.max(), d.mean(), (d / np.maximum(np.abs(r), np.finfo(np.float32).tiny)).max(), \
        np.dot(r, g) / math.sqrt(np.dot(r, r) * np.dot(g, g))


@pytest.mark.parametrize("noise", [1e-7, 1e-4, 0.5])
def test_compare_matches_float64(noise):
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((64, 3000)).astype(np.float32)
    got = (ref + noise * rng.standard_normal(ref.shape)).astype(np.float32)
    m = compare(ref, got)
    max_abs, mean_abs, max_rel, cosine = _reference(ref, got)
    assert m.max_abs == pytest.approx(max_abs, rel=1e-6)
    assert m.mean_abs == pytest.approx(mean_abs, rel=1e-4)
    assert m.max_rel == pytest.approx(max_rel, rel=1e-6)
    assert abs(m.cosine - cosine) < 1e-12 + 1e-6 * (1 - cosine)  # 1 - cos is what carries the information
    worst = abs(float(got[m.worst_index]) - float(ref[m.worst_index]))
    assert worst == pytest.approx(max_abs, rel=1e-6)
    assert m.nan == m.inf == 0


def test_compare_counts_nan_and_inf_and_reports_them_as_worst():
    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = ref.copy()
    got[1, 2], got[2, 0] = np.nan, np.inf
    m = compare(ref, got)
    assert (m.nan, m.inf) == (1, 1)
    assert m.max_abs == math.inf and m.worst_index in {(1, 2), (2, 0)}


def test_budget_ratio_is_infinite_for_nan_and_zero_for_equal():
    rng = np.random.default_rng(2)
    y = rng.standard_normal(1000).astype(np.float32)
    e_ref = (y * 1e-7).astype(np.float32)
    budget = budget_for(LAYER, {"torch": "fp32", "paddle": "fp32"}, y, e_ref, None)
    assert budget.ratio(np.zeros_like(y))[0] == 0.0
    diff = np.zeros_like(y)
    diff[17] = np.nan
    assert budget.ratio(diff)[0] == math.inf
    small = np.abs(e_ref)  # as large as torch's own float32 error: well within budget
    assert 0 < budget.ratio(small)[0] < 1


@pytest.mark.slow


def test_by_identity_forgets_changed_and_dead_objects():
    import gc
    import weakref

    import torch

    from converter.compare.identity import ByIdentity
    table = ByIdentity()
    t = torch.zeros(3)
    table.put(t, "zeros", t._version)
    assert table.get(t, t._version) == "zeros"
    t.add_(1)  # changed in place: its version moves on
    assert table.get(t, t._version) is None
    other = torch.zeros(3)
    table.put(other, "other")
    alive = weakref.ref(other)
    del other
    gc.collect()
    assert alive() is None  # the table does not keep its keys alive, so their ids can be reused
    assert table.get(torch.zeros(3)) is None


@pytest.mark.parametrize("make", [
    lambda torch: (torch.nn.Linear(96, 40), torch.randn(3, 7, 96)),
    lambda torch: (torch.nn.Conv2d(6, 8, 3, padding=1, padding_mode="reflect"), torch.randn(2, 6, 9, 9)),
    lambda torch: (torch.nn.Conv2d(8, 8, 3, groups=4), torch.randn(2, 8, 9, 9)),
    lambda torch: (torch.nn.ConvTranspose2d(6, 4, 3, stride=2), torch.randn(2, 6, 5, 5)),
], ids=["linear", "conv_reflect", "conv_groups", "conv_transpose"])
def test_s2_in_bf16_is_within_two_percent_of_float64(make):
    """S2 sets the budget's scale, not its last digits: squares rounded to bf16 and summed in
    float32 stay within 2% of S2 in float64, elementwise."""
    import torch

    from converter.compare.capture import Call
    from converter.compare.replay import matmul_stats
    torch.manual_seed(0)
    module, x = make(torch)
    exact = matmul_stats(module.double(), Call("m", "T", 0, args=(x.double(),)), torch.float64)
    module.float()
    for dtype in (torch.bfloat16, None):  # bf16, then what this machine picks by default
        got = matmul_stats(module, Call("m", "T", 0, args=(x,)), dtype)
        assert got.sum_sq.dtype == np.float32 and got.sum_sq.shape == exact.sum_sq.shape and got.k == exact.k
        assert np.abs(got.sum_sq / exact.sum_sq - 1).max() < 0.02


def test_float64_minus_float32_is_exact_before_its_rounding_to_float32():
    """The float64 reference's error is computed in float64 and only then stored as float32."""
    import torch

    from converter.compare.forced import _minus
    rng = np.random.default_rng(3)
    r32 = torch.from_numpy(rng.standard_normal(5000).astype(np.float32))
    v64 = r32.double() + torch.from_numpy(rng.standard_normal(5000) * 1e-8)
    got = _minus(v64, r32)
    assert got.dtype == np.float32
    assert np.array_equal(got, (v64.numpy() - r32.numpy().astype(np.float64)).astype(np.float32))
    half = _minus(v64, r32.half())  # a float16 recording widens exactly too
    assert np.array_equal(half, (v64.numpy() - r32.half().numpy().astype(np.float64)).astype(np.float32))


@pytest.mark.slow


def test_by_identity_made_keeps_one_copy_while_it_lives_and_is_usable():
    import gc
    import weakref

    import torch

    from converter.compare.identity import ByIdentity
    table = ByIdentity()
    t = torch.ones(4)
    made = []
    make = lambda: made.append(t.double()) or made[-1]
    unchanged = lambda c: c._version == 0
    first = table.weakly_kept(t, make, t._version, usable=unchanged)
    assert table.weakly_kept(t, make, t._version, usable=unchanged) is first and len(made) == 1
    first.add_(1)  # changed in place by whoever holds it: not handed out again
    second = table.weakly_kept(t, make, t._version, usable=unchanged)
    assert second is not first and len(made) == 2
    alive = weakref.ref(second)
    made.clear()
    del first, second
    gc.collect()
    assert alive() is None  # the table holds its copies by weak reference only
