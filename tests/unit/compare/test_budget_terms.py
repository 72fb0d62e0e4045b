"""The budget as a sum of named terms, without models: the terms add up to the variance the
budget judges with, the term that dominates at the worst element is the one the arithmetic
says (a matmul's inputs rounded to TF32, its fp32 sums over a long reduction, an op's
condition), a training row's terms are those the training judge adds, and a Budget is set once."""

import math

import numpy as np
import pytest

from converter.compare import budget as B
from converter.compare.budget_terms import (ACCUMULATION, CONDITION, CONVENTION, INPUT_ROUNDING, OBSERVED,
                                            STAND_IN, breakdown_words)

FP32 = {"torch": "fp32", "paddle": "fp32"}
TF32 = {"torch": "fp32", "paddle": "tf32"}


def _matmul(k, fmt_rounding=None, seed=0):
    """A real product y = x @ w of reduction k, its float64 value, S2 and K."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((32, k)).astype(np.float32)
    w = (rng.standard_normal((k, 48)) / math.sqrt(k)).astype(np.float32)
    y32 = x @ w
    y64 = x.astype(np.float64) @ w.astype(np.float64)
    s2 = (x.astype(np.float64) ** 2) @ (w.astype(np.float64) ** 2)
    return y32, y64, B.MatmulStats(s2.astype(np.float32), float(k))


def _sum_of_terms(budget, index):
    """The variance at `index` rebuilt from the parts' named shares alone."""
    return sum(share.scale * part.base_at(index) for part in budget.parts for group in part.groups for share in group)


@pytest.mark.parametrize("formats", [FP32, TF32, {"torch": "bf16", "paddle": "fp32"}])
def test_the_named_terms_add_up_to_the_variance_of_a_matmul_row(formats):
    y32, y64, stats = _matmul(512)
    budget = B.make_budget(formats, y32, y64, stats)
    for index in (0, 17, budget.var.size - 1):
        assert _sum_of_terms(budget, index) == pytest.approx(float(budget.var.flat[index]), rel=1e-5)
        shares = budget.terms_at(index).terms
        assert sum(f for _, _, f in shares) == pytest.approx(1.0, abs=5e-3)


def test_the_named_terms_add_up_to_the_variance_of_an_observed_row():
    rng = np.random.default_rng(3)
    y = rng.standard_normal(4096).astype(np.float32)
    e_ref = (y * rng.standard_normal(4096) * 6e-8).astype(np.float32)
    other = (y * rng.standard_normal(4096) * 2e-7).astype(np.float32)
    condition = np.abs(y * 6e-8).astype(np.float32)
    effect = (y * rng.standard_normal(4096) * 3e-4).astype(np.float32)
    budget = B.budget_for(B.END_TO_END, TF32, y, e_ref, None, {"tf32": effect}, condition, other)
    names = {(t, s) for part in budget.parts for group in part.groups for share in group for t, s in
             [(share.term, share.side)]}
    assert {(OBSERVED, "torch"), (OBSERVED, "paddle"), (CONDITION, "torch"), (INPUT_ROUNDING, "paddle")} <= names
    for index in (0, 1000, 4095):
        assert _sum_of_terms(budget, index) == pytest.approx(float(budget.var.flat[index]), rel=1e-5)


def test_tf32_input_rounding_dominates_a_long_matmul_whose_paddle_side_runs_tf32():
    y32, y64, stats = _matmul(1536)
    diff = np.abs(y32 - y64).astype(np.float32)
    tf32 = B.make_budget(TF32, y32, y64, stats).judge(diff)
    assert tf32.terms.dominant == (INPUT_ROUNDING, "paddle") and tf32.terms.share_of(INPUT_ROUNDING) > 0.9
    assert "TF32" in breakdown_words(tf32.terms, TF32)
    fp32 = B.make_budget(FP32, y32, y64, stats).judge(diff)
    assert fp32.terms.dominant[0] == ACCUMULATION and fp32.terms.share_of(INPUT_ROUNDING) == 0
    # the same difference judged against both: TF32's budget is far wider, by its unit over fp32's sums
    assert tf32.tolerance > 100 * fp32.tolerance and tf32.ratio < fp32.ratio


def test_an_ill_conditioned_op_is_dominated_by_its_condition():
    rng = np.random.default_rng(4)
    y = rng.standard_normal(1000).astype(np.float32)
    e_ref = np.zeros_like(y)  # torch's own error 0 by chance
    condition = np.abs(y * 1e-5).astype(np.float32)
    judged = B.budget_for(B.LAYER, FP32, y, e_ref, condition=condition).judge(np.abs(y * 1e-6))
    assert judged.terms.dominant[0] == CONDITION and judged.ratio < 1


def test_paddles_error_stands_in_as_torchs_unless_measured():
    rng = np.random.default_rng(5)
    y = rng.standard_normal(100).astype(np.float32)
    e_ref = (y * 1e-7).astype(np.float32)
    sides = lambda b: {(share.term, share.side) for part in b.parts for g in part.groups for share in g}
    assert (STAND_IN, "paddle") in sides(B.budget_for(B.LAYER, FP32, y, e_ref, None))
    assert (OBSERVED, "paddle") in sides(B.budget_for(B.LAYER, FP32, y, e_ref, None, e_other=e_ref * 3))


def test_a_training_row_names_the_terms_a_training_comparison_adds():
    rng = np.random.default_rng(6)
    y = rng.standard_normal((40, 30)).astype(np.float32)
    e_ref = (y * rng.standard_normal(y.shape) * 1e-7).astype(np.float32)
    condition = np.abs(y * 3e-8).astype(np.float32)
    extra = np.abs(y * 2e-6).astype(np.float32)
    layer = B.budget_for(B.LAYER, FP32, y, e_ref, None, None, condition)
    named = B.budget_for(B.TRAINING, FP32, y, e_ref, None, None, condition, conventions=extra)
    # a layer's terms, plus the condition's mean square for every element and the conventions' own
    expected = layer.var + np.float32(2 * np.mean(np.square(condition, dtype=np.float64))) + np.square(extra)
    assert np.array_equal(named.var, expected)
    worst = int(np.argmax(extra))
    assert named.terms_at(worst).dominant == (CONVENTION, "")


def test_a_budget_is_set_once():
    y32, y64, stats = _matmul(64)
    budget = B.make_budget(FP32, y32, y64, stats)
    for name in ("var", "parts", "formats", "observed"):
        with pytest.raises(AttributeError):
            setattr(budget, name, None)
    with pytest.raises(AttributeError):
        budget.other = 1
    with pytest.raises(ValueError):  # its variance is read-only: a further term is one of budget_for's
        budget.var += 1
    with pytest.raises(ValueError):
        B.budget_for("gradient", FP32, y32, y32 - y64)
    with pytest.raises(ValueError):
        B.budget_for(B.END_TO_END, FP32, y32, y32 - y64, stats)


def test_own_errors_are_each_sides_distance_from_float64():
    rng = np.random.default_rng(7)
    y64 = rng.standard_normal(500)
    y_torch = (y64 + 1e-7 * rng.standard_normal(500)).astype(np.float32)
    y_paddle = (y64 + 1e-4 * rng.standard_normal(500)).astype(np.float32)
    own = B.own_errors((y64 - y_torch).astype(np.float32), y_paddle - y_torch)
    assert own["torch"] == pytest.approx(np.abs(y_torch - y64).max(), rel=1e-4)
    assert own["paddle"] == pytest.approx(np.abs(y_paddle - y64).max(), rel=1e-4)


def test_one_rule_says_where_paddle_own_error_is_measured():
    from converter.compare.paddle_own import BACKWARD, INSIDE, LEAF, OWN_SIZE, measures_own_error
    # a leaf always, within its size
    assert measures_own_error(LEAF, (), 10) and not measures_own_error(LEAF, (), OWN_SIZE[LEAF] + 1)
    # a layer with layers inside once over its budget on torch's error alone, never when not judged
    assert measures_own_error(INSIDE, [1.5], 10) and not measures_own_error(INSIDE, [1.0], 10)
    assert not measures_own_error(INSIDE, [None]) and not measures_own_error(INSIDE, [2.0], OWN_SIZE[INSIDE] + 1)
    # a backward once one row is past half its budget, whatever its size
    assert measures_own_error(BACKWARD, [0.1, 0.6], 1 << 40) and not measures_own_error(BACKWARD, [0.5, 0.2])
