"""verify-port on inputs and models that a careless or hostile spec gives: each is exit 2 with
one line, or an honest verdict, never a traceback and never a pass it has not earned."""

import numpy as np
import pytest

from helpers.cli import run_convert, run_verify

SPEC = '''
import numpy as np
import paddle
import torch

SCALE = {scale}


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return {torch_out}


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.a = paddle.nn.Linear(8, 8)
        self.b = paddle.nn.Linear(8, 8)

    def forward(self, x):
        y = self.b(paddle.nn.functional.relu(self.a(x)) * {bug})
        return {paddle_out}


def torch_model():
    torch.manual_seed(0)
    return TorchNet(){torch_cast}


def paddle_model():
    return PaddleNet()


def inputs():
    return ({inputs},)
'''

NORMAL = "np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32) * np.float32(SCALE)"


def write_spec(tmp_path, name="spec.py", scale="1.0", torch_out="y", paddle_out="y", bug="1.0", torch_cast="",
               inputs=NORMAL, extra=""):
    path = tmp_path / name
    path.write_text(SPEC.format(scale=scale, torch_out=torch_out, paddle_out=paddle_out, bug=bug,
                                torch_cast=torch_cast, inputs=inputs) + extra)
    return path


def one_line(r, code):
    """The run ended with `code` and (for a bad input) one line on stderr, no traceback."""
    assert r.code == code, r
    assert "Traceback" not in r.stderr + r.stdout, r
    if code == 2:
        assert len(r.stderr.strip().splitlines()) == 1, r
        assert r.stderr.startswith("error: "), r
        assert r.stdout == "", r  # no partial report
    return r.stderr


# budgets that overflow float32 -------------------------------------------------------------

def test_budget_of_values_whose_squares_overflow_float32_stays_finite():
    from converter.compare.budget import make_budget
    rng = np.random.default_rng(0)
    y64 = rng.standard_normal(256) * 2.5e19  # squares above float32's 3.4e38
    y32 = y64.astype(np.float32)
    budget = make_budget({"torch": "fp32", "paddle": "fp32"}, y32, y64, None, {})
    assert np.isfinite(budget.var).all()
    clean, _ = budget.ratio(np.abs(y32.astype(np.float64) - y64))
    planted, _ = budget.ratio(np.abs(y32 * np.float32(1.5) - y32))
    assert clean < 1 < planted, (clean, planted)


def test_small_values_keep_a_float32_budget():
    from converter.compare.budget import make_budget
    y64 = np.random.default_rng(1).standard_normal(64)
    budget = make_budget({"torch": "fp32", "paddle": "fp32"}, y64.astype(np.float32), y64, None, {})
    assert budget.var.dtype == np.float32


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_activations_of_1e30_pass_a_clean_port_and_fail_a_planted_scale(tmp_path, strategy):
    clean = write_spec(tmp_path, "clean.py", scale="1e30")
    r = run_verify("--spec", clean, "--device", "cpu", "--strategy", strategy)
    assert r.code == 0 and "PASS" in r.stdout, r
    planted = write_spec(tmp_path, "planted.py", scale="1e30", bug="1.5")
    r = run_verify("--spec", planted, "--device", "cpu", "--strategy", strategy)
    assert r.code == 1 and "FAIL" in r.stdout, r


# what the models return ------------------------------------------------------------------------

@pytest.mark.parametrize("out,said", [
    ("None", "None"),
    ("'text'", "a str"),
    ("1.5", "a float"),
    ("{1, 2}", "a set"),
    ("(v for v in (1, 2))", "a generator"),
])
def test_outputs_with_no_floating_tensor_are_named(tmp_path, out, said):
    path = write_spec(tmp_path, torch_out=out, paddle_out=out)
    err = one_line(run_verify("--spec", path, "--device", "cpu"), 2)
    assert "neither model returns a floating tensor" in err
    assert f"torch_model() returns {said}, paddle_model() returns {said}" in err, err


@pytest.mark.parametrize("torch_out,paddle_out,t_said,p_said", [
    ("{0: y}", "{'0': y}", "{0: tensor}", "{'0': tensor}"),
    ("{'a': y}", "(y,)", "{'a': tensor}", "tensor"),
    ("{'a': y, 'b': 2 * y}", "(2 * y, y)", "{'a': tensor, 'b': tensor}", "(tensor, tensor)"),
    ("(y, None)", "(y, 1)", "(tensor, None)", "(tensor, a int)"),
])
@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_structures_are_compared_by_key_and_type(tmp_path, torch_out, paddle_out, t_said, p_said, strategy):
    path = write_spec(tmp_path, torch_out=torch_out, paddle_out=paddle_out)
    err = one_line(run_verify("--spec", path, "--device", "cpu", "--strategy", strategy), 2)
    assert f"torch_model() returns {t_said}, paddle_model() returns {p_said}" in err, err


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_swapped_outputs_under_the_same_keys_fail(tmp_path, strategy):
    path = write_spec(tmp_path, torch_out="{'a': y, 'b': 2 * y}", paddle_out="{'a': 2 * y, 'b': y}")
    r = run_verify("--spec", path, "--device", "cpu", "--strategy", strategy)
    assert r.code == 1 and "FAIL" in r.stdout, r


@pytest.mark.parametrize("torch_out,paddle_out", [
    ("(y, 2 * y, x.long())", "[y, 2 * y, x.astype('int64')]"),
    ("y", "(y,)"),
])
def test_the_same_structure_in_a_list_and_a_tuple_passes(tmp_path, torch_out, paddle_out):
    path = write_spec(tmp_path, torch_out=torch_out, paddle_out=paddle_out)
    r = run_verify("--spec", path, "--device", "cpu")
    assert r.code == 0 and "PASS" in r.stdout, r


# models of different dtypes ---------------------------------------------------------------------

@pytest.mark.parametrize("cast,dtype", [(".double()", "float64"), (".bfloat16()", "bfloat16")])
def test_models_of_different_dtypes_are_named(tmp_path, cast, dtype):
    path = write_spec(tmp_path, torch_cast=cast)
    err = one_line(run_verify("--spec", path, "--device", "cpu"), 2)
    assert f"torch_model()'s a.weight is {dtype}, paddle_model()'s a.weight is float32" in err, err


# inputs -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("inputs,words", [
    ("np.zeros((0, 8), np.float32)", "has shape [0, 8]: an empty batch"),
    ("np.full((2, 8), np.nan, np.float32)", "holds nan at [0, 0]"),
    ("np.where(np.arange(16).reshape(2, 8) == 11, np.inf, 1).astype(np.float32)", "holds inf at [1, 3]"),
    ("np.array([[object()] * 8] * 2)", "is an array of object"),
])
def test_bad_inputs_are_named_before_anything_runs(tmp_path, inputs, words):
    path = write_spec(tmp_path, inputs=inputs)
    err = one_line(run_verify("--spec", path, "--device", "cpu"), 2)
    assert "inputs()[0]" in err and words in err, err


# non-finite outputs --------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_a_torch_run_that_overflows_float32_is_named(tmp_path, strategy):
    path = write_spec(tmp_path, scale="1e20", torch_out="y * 1e30", paddle_out="y * 1e30")
    err = one_line(run_verify("--spec", path, "--device", "cpu", "--strategy", strategy), 2)
    assert "torch_model()'s own float32 run gives inf" in err and "float64 run gives" in err, err


@pytest.mark.parametrize("strategy,where", [("full", "<model>"), ("binary", "<model>")])
def test_a_nan_on_paddle_side_only_fails(tmp_path, strategy, where):
    """The NaN comes from the model's own code after its last block: binary names it where full does."""
    path = write_spec(tmp_path, bug="float('nan')")
    r = run_verify("--spec", path, "--device", "cpu", "--strategy", strategy)
    assert r.code == 1, r
    assert f"FAIL: first layer over budget: {where} " in r.stdout, r


# spec code raising what is no Exception ---------------------------------------------------------------

@pytest.mark.parametrize("part", ["import", "torch_model", "paddle_model", "inputs", "forward"])
@pytest.mark.parametrize("raised", ["asyncio.CancelledError('stop')", "Halt('stop')"])
def test_base_exceptions_from_a_spec_are_one_line(tmp_path, part, raised):
    """asyncio.CancelledError raised at the spec's import printed a traceback of 34 lines (exit 1)."""
    extra = "\nimport asyncio\n\n\nclass Halt(BaseException):\n    pass\n"
    if part == "forward":
        path = write_spec(tmp_path, torch_out=f"(_ for _ in ()).throw({raised})", extra=extra)
    elif part == "import":
        path = write_spec(tmp_path, extra=extra + f"\n\nraise {raised}\n")
    else:
        extra += f"\n\ndef {part}():\n    raise {raised}\n"
        path = write_spec(tmp_path, extra=extra)
    err = one_line(run_verify("--spec", path, "--device", "cpu"), 2)
    assert raised.split("(")[0].split(".")[-1] + ": stop" in err and "(line " in err, err


def test_a_base_exception_at_import_of_a_spec_convert_weights_reads_is_one_line(tmp_path):
    import torch
    path = write_spec(tmp_path, extra="\nimport asyncio\n\nraise asyncio.CancelledError()\n")
    torch.save({"w": torch.zeros(2)}, tmp_path / "m.pt")
    r = run_convert(tmp_path / "m.pt", tmp_path / "o.pdparams", "--spec", path)
    assert r.code == 2 and len(r.stderr.splitlines()) == 1, r
    assert r.stderr.startswith(f"error: spec '{path}' failed to import: CancelledError (line "), r
    assert not (tmp_path / "o.pdparams").exists()


def test_a_keyboard_interrupt_from_a_spec_stays_an_interrupt(tmp_path):
    path = write_spec(tmp_path, extra="\n\ndef inputs():\n    raise KeyboardInterrupt\n")
    r = run_verify("--spec", path, "--device", "cpu")
    assert r.code == 130 and r.stderr.splitlines() == ["interrupted; nothing was written"], r


@pytest.mark.parametrize("depth,code", [(3000, 2), (150, 2), (90, 0)])
def test_outputs_nested_past_the_walks_bound_are_one_line(tmp_path, depth, code):
    """A tuple nested 3000 deep was a RecursionError (exit 3); the walk's bound is 100."""
    extra = "\n\ndef _nest(y, n):\n    for _ in range(n):\n        y = (y,)\n    return y\n"
    path = write_spec(tmp_path, torch_out=f"_nest(y, {depth})", paddle_out=f"_nest(y, {depth})", extra=extra)
    r = run_verify("--spec", path, "--device", "cpu")
    if code == 2:
        err = one_line(r, 2)
        assert "more than 100 deep" in err, err
    else:
        assert r.code == 0 and "PASS" in r.stdout, r


def test_the_walks_bound_is_stated_and_kept():
    from converter.errors import UserError
    from converter.tree import MAX_DEPTH, flatten, map_leaves
    value = 1.0
    for _ in range(MAX_DEPTH):
        value = [value]
    assert flatten(value, lambda v: isinstance(v, float)) == [1.0]
    assert map_leaves(value, lambda v: v + 1, lambda v: isinstance(v, float)) != value
    with pytest.raises(UserError, match="more than 100 deep"):
        flatten([value], lambda v: isinstance(v, float))
    with pytest.raises(UserError, match="more than 100 deep"):
        map_leaves({"a": value}, lambda v: v, lambda v: isinstance(v, float))


SCALED = """
import numpy as np
import paddle
import torch


class TorchScale(torch.nn.Module):
    def forward(self, x):
        return {torch_op}


class PaddleScale(paddle.nn.Layer):
    def forward(self, x):
        return {paddle_op}


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = TorchScale()

    def forward(self, x):
        return torch.tanh(self.scale(x)){torch_tail}


class PaddleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.scale = PaddleScale()

    def forward(self, x):
        return paddle.tanh(self.scale(x)){paddle_tail}


def torch_model():
    return TorchNet()


def paddle_model():
    return PaddleNet()


def inputs():
    return (np.full((2, 3), {value}, dtype=np.float32),)
"""


def _scaled_spec(tmp_path, value, torch_op, paddle_op=None, tail=""):
    path = tmp_path / "scaled.py"
    path.write_text(SCALED.format(value=value, torch_op=torch_op, paddle_op=paddle_op or torch_op,
                                  torch_tail=tail, paddle_tail=tail))
    return path


@pytest.mark.parametrize("strategy", ["full", "binary"])
@pytest.mark.parametrize("value,op", [("-3e38", "x * 4"), ("3e38", "x * x * x * x * x * x * x * x * x * x")])
def test_outputs_that_overflow_on_both_sides_are_never_a_pass(tmp_path, strategy, value, op):
    """Inputs near float32's largest value overflow both models inside a layer: -inf on both sides
    was taken for a mask and the run said PASS (float64 finite); where float64 overflows too, the
    binary search of a model with no unit failed (IndexError, exit 3)."""
    for tail in ("", " * 0 + x"):
        err = one_line(run_verify("--spec", _scaled_spec(tmp_path, value, op, tail=tail), "--device", "cpu",
                                  "--strategy", strategy), 2)
        assert "gives -inf" in err or "gives inf" in err, err
        assert "float32" in err and "smaller scale" in err, err


@pytest.mark.parametrize("strategy", ["full", "binary"])
def test_an_infinity_on_paddle_side_only_fails_where_torch_looks_masked(tmp_path, strategy):
    """torch's -4e37 is at or below the mask threshold (-1e3); paddle's -inf there was taken for a
    mask on both sides, and the run said PASS."""
    r = run_verify("--spec", _scaled_spec(tmp_path, "-1e37", "x * 4", "x * 40"), "--device", "cpu",
                   "--strategy", strategy)
    assert r.code == 1 and "FAIL: first layer over budget: scale " in r.stdout, r
