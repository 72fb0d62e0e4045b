"""verify-port where the two sides call their layers differently (see tests/specs/signatures.py),
and the input and output matching that makes that work."""

import importlib.util

import numpy as np
import pytest

from helpers.cli import run_verify, spec_path


def _spec_module():
    spec = importlib.util.spec_from_file_location("signatures_spec", spec_path("signatures"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verify(bug=None, strategy="full"):
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options
    m = _spec_module()
    spec = spec_from_functions(m.torch_model, lambda: m.paddle_model(bug), m.inputs, m.mapping)
    return verify(spec, Options(device="cpu", strategy=strategy), bisect=True)


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_clean_port_with_other_signatures_passes(strategy):
    report = _verify(strategy=strategy)
    assert report.verdict == "pass", [(r.torch, r.ratio, r.note) for r in report.layers]
    assert report.outputs is not None and report.outputs.within_budget
    assert all(r.ratio is not None for r in report.layers)  # every compared pair has a verdict
    if strategy == "full":
        rows = {r.torch: r for r in report.layers}
        assert "broadcasting" in rows["emb.pos"].note  # [1, T, H] against [B, T, H]
        assert "no counterpart" in rows["attn"].note  # paddle's mask: torch is causal inside


@pytest.mark.parametrize("bug,culprit,word", [
    ("no_causal_mask", "attn", "causal"),
    ("unscaled", "attn", "scale"),
    ("qk_exchanged", "attn", "exchanged"),
    ("positions_from_one", "emb", "own forward"),
    ("last_token_masked", "attn", "mask"),
])
@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.slow
def test_bug_inside_a_layer_with_another_signature_is_named(bug, culprit, word, strategy):
    report = _verify(bug, strategy)
    assert report.verdict == "fail" and report.exit_code == 1
    assert report.first_bad.torch == culprit, [(r.torch, r.ratio) for r in report.layers if r.within_budget is False]
    assert report.outputs is None or report.outputs.within_budget is False or strategy == "binary"
    if strategy == "full":
        assert any(word in d.cause for d in report.diagnosis), report.diagnosis


def test_outputs_of_another_structure_are_bad_input(tmp_path):
    body = open(spec_path("signatures")).read().replace(
        "return self.head(self.norm(h + self.attn(h)))", "y = self.head(self.norm(h + self.attn(h)))\n        return y, 2 * y")
    path = tmp_path / "two_outputs.py"
    path.write_text(body)
    r = run_verify("--spec", path, "--device", "cpu")
    assert r.code == 2, r
    assert "different outputs" in r.stderr and "[2, 10, 50], [2, 10, 50]" in r.stderr and len(r.stderr.splitlines()) == 1


# ---- the matching itself

def test_values_match_up_to_broadcasting():
    from converter.compare.matching import fit, same_values
    row = np.arange(6)[None]
    assert same_values(np.repeat(row, 3, 0), row) == 0.0
    assert same_values(np.repeat(row, 3, 0), row + 1) is None  # integers: exactly or not at all
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    assert same_values(x + 1e-6, x) is not None and same_values(-x, x) is None
    assert fit(row, (3, 6)).shape == (3, 6)
    assert fit(np.repeat(row, 3, 0), (1, 6)).tolist() == row.tolist()  # equal rows: one is enough
    assert fit(np.arange(12).reshape(2, 6), (1, 6)) is None  # rows that differ cannot be cut to one


def test_masks_in_other_conventions_are_the_same_positions():
    from converter.compare.matching import same_mask
    keep = np.array([[1, 1, 1, 0]], bool)  # batch 1, the last token is padding
    additive = np.where(keep, 0.0, -1e4).astype(np.float32).reshape(1, 1, 1, 4)
    hf_like = np.broadcast_to(np.where(keep, 0.0, np.finfo(np.float32).min), (1, 1, 4, 4)).astype(np.float32)
    assert same_mask(additive, hf_like)
    assert same_mask(keep.reshape(1, 1, 1, 4), hf_like)  # boolean, True keeps
    assert not same_mask(np.where(~keep, 0.0, -1e4).astype(np.float32).reshape(1, 1, 1, 4), hf_like)
    causal5 = np.triu(np.full((4, 5), -1e9, np.float32), 1)[None, None]  # HF: one key more, for the cache
    assert same_mask(np.triu(np.full((4, 4), -1e4, np.float32), 1)[None, None], causal5)


def test_inputs_pair_by_value_not_by_position():
    from converter.compare.matching import MASK, NONE, POSITION, VALUE, match_inputs
    h = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    positions = np.arange(5)[None]
    causal = np.triu(np.full((5, 5), -1e4, np.float32), 1)[None, None]
    # paddle: query, key, value (one tensor three times), a mask torch does not take, positions [B, T]
    paddle_inputs = [h, h, h, causal, np.repeat(positions, 2, 0)]
    torch_inputs = [positions, h + 1e-7]
    got = [(m.source, m.how) for m in match_inputs(paddle_inputs, torch_inputs)]
    assert got == [(1, VALUE), (1, VALUE), (1, VALUE), (None, NONE), (0, VALUE)]
    # the same argument computed differently (positions from one): paired as a leftover, to be charged
    got = match_inputs([np.repeat(positions + 1, 2, 0)], [positions])
    assert [(m.source, m.how) for m in got] == [(0, POSITION)]
    # cos and sin stacked into one tensor where torch passes them apart: no torch input stands for it
    rng = np.random.default_rng(3)
    cos, sin = (rng.standard_normal((1, 6, 4)).astype(np.float32) for _ in range(2))
    stacked = np.broadcast_to(np.stack([cos, sin])[:, None], (2, 2, 1, 6, 4)).reshape(2, 2, 6, 4) + np.float32(1e-3)
    got = match_inputs([h, stacked], [h, cos, sin])
    assert [(m.source, m.how) for m in got] == [(0, VALUE), (None, NONE)]
    # one torch input broadcast over paddle's batch, computed differently: paired as a leftover
    got = match_inputs([np.repeat(cos, 2, 0) * np.float32(2)], [cos])
    assert [(m.source, m.how) for m in got] == [(0, POSITION)]
    pad = np.where(np.array([[1, 1, 1, 1, 0]], bool), 0.0, -1e4).astype(np.float32).reshape(1, 1, 1, 5)
    got = match_inputs([pad], [np.where(pad < 0, np.float32(-3e38), np.float32(0)).repeat(5, 2)])
    assert [(m.source, m.how) for m in got] == [(0, MASK)]


def test_several_outputs_pair_by_value():
    from converter.compare.matching import pair_outputs
    rng = np.random.default_rng(1)
    emb, h1, last = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3))
    torch_out = [last, emb, h1, last]  # HF: the last hidden state, then all of them
    paddle_out = [emb, emb, h1, last]  # PaddleNLP's DeBERTa encoder: its input first
    pairs = pair_outputs([a.shape for a in torch_out], [b.shape for b in paddle_out],
                         lambda: torch_out, lambda: paddle_out)
    assert pairs.torch == (0, 1, 2, 3) and pairs.paddle == (3, 1, 2, 3)  # its own position first where as near


def test_final_outputs_over_budget_fail_even_when_no_layer_is_isolated():
    from converter.verify.report import LayerResult, Report, render_text
    from converter.verify.run import _not_isolated
    rows = [LayerResult("block", "block", "Block", "Block", (2, 4), ratio=0.4),
            LayerResult("block.inner", "block.inner", "Inner", "Inner", (2, 4), note="could not be judged: ..."),
            LayerResult("", "", "Model", "Model", (2, 4), ratio=0.5)]
    outputs = LayerResult("", "", "Model", "Model", (2, 4), max_abs=0.3, budget=1e-6, ratio=3e5)
    report = Report(rows, outputs, {"torch": {"effective": "fp32"}, "paddle": {"effective": "fp32"}},
                    [_not_isolated(rows, outputs)], "full", 2, [], outputs)
    assert report.verdict == "fail" and report.exit_code == 1
    text = render_text(report)
    assert "FAIL: the final outputs differ beyond noise" in text and "in or under block.inner" in text


def test_reports_render_infinite_figures():
    from converter.verify.page import render_html
    from converter.verify.report import LayerResult, Report, render_text
    bad = LayerResult("attn", "attn", "Attention", "Attention", (2, 4), max_abs=3.4e38, local_max_abs=3.4e38,
                      budget=float("inf"), ratio=float("inf"))
    fine = LayerResult("", "", "Model", "Model", (2, 4), max_abs=1e-7, local_max_abs=1e-7, budget=1e-6, ratio=0.1)
    report = Report([bad, fine], bad, {"torch": {"effective": "fp32"}, "paddle": {"effective": "fp32"}}, [], "full", 2)
    assert "ratio inf" in render_text(report) and "<svg" in render_html(report)
