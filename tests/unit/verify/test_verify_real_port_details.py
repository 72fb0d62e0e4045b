"""Details real ports showed (HF Bloom, T5 and OPT against PaddleNLP), kept here without
transformers: dropouts of one path whose outputs differ in layout, outputs both sides mask in
their own convention, and an elementwise formula that cancels."""

import math

import numpy as np
import pytest
import paddle
import torch

from converter.compare.capture import Call
from helpers.resnet import resnet_like


def test_same_path_layers_without_weights_pair_only_when_their_outputs_can_agree():
    from converter.compare.align import align

    def call(path, shape, end):
        return Call(path, "Dropout", 0, end, shapes=[shape])
    torch_calls = {"drop": call("drop", (2, 4, 3, 3), 0), "": Call("", "Model", 0, 2, shapes=[(2, 3)])}
    paddle_calls = {"drop": call("drop", (4, 2, 3, 3), 0), "": Call("", "Model", 0, 2, shapes=[(2, 3)])}
    assert [p.torch for p in align(torch_calls, paddle_calls)] == [""]
    paddle_calls["drop"] = call("drop", (2, 4, 3, 3), 0)
    assert [p.torch for p in align(torch_calls, paddle_calls)] == ["drop", ""]
    paddle_calls["drop"] = call("drop", (8, 3, 3), 0)  # Bloom's [B*H, T, T] against HF's [B, H, T, T]: a merge
    assert [p.torch for p in align(torch_calls, paddle_calls)] == ["drop", ""]


def test_positions_both_sides_mask_are_no_error():
    from converter.compare.matching import masked_alike
    bias = np.array([[0.5, -3.4e38], [0.2, 0.1]], np.float32)
    other = np.array([[0.5, -1e9], [0.2, 0.1]], np.float32)
    assert masked_alike(bias, other).tolist() == [[False, True], [False, False]]
    assert masked_alike(bias, np.array([[0.5, 0.0], [0.2, 0.1]], np.float32)) is None  # masked on one side: an error
    assert masked_alike(np.ones((2, 2), np.float32), other) is None


class _TorchGeluTanh(torch.nn.Module):  # HF's formula, no parameters: no family covers it
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class _TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = _TorchGeluTanh()

    def forward(self, x):
        return self.act(x)


class _PaddleGeluTanh(paddle.nn.Layer):  # PaddleNLP Bloom's: the same formula, paddle's tanh
    def forward(self, x):
        return x * 0.5 * (1.0 + paddle.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


class _PaddleModel(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.act = _PaddleGeluTanh()

    def forward(self, x):
        return self.act(x)


def test_an_elementwise_formula_that_cancels_is_not_a_false_alarm():
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options

    x = np.linspace(-6.0, -2.0, 4096, dtype=np.float32).reshape(64, 64)  # where 0.5 x (1 + tanh) cancels
    report = verify(spec_from_functions(_TorchModel, _PaddleModel, lambda: (x,), label="gelu"), Options(device="cpu"))
    rows = {r.torch: r for r in report.layers}
    assert report.verdict == "pass", [(r.torch, r.ratio, r.local_max_abs, r.budget) for r in report.layers]
    assert rows["act"].ratio is not None and rows["act"].local_max_abs > 0


class _TiedTorch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(20, 8), torch.nn.Linear(8, 20, bias=False)
        self.head.weight = self.emb.weight  # HF ties the head to the embedding (T5 v1.0, GPT-2)

    def forward(self, ids):
        return self.head(self.emb(ids))


class _TiedPaddle(paddle.nn.Layer):  # the head computed from the embedding: no head parameter
    def __init__(self):
        super().__init__()
        self.emb = paddle.nn.Embedding(20, 8)

    def forward(self, ids):
        return paddle.matmul(self.emb(ids), self.emb.weight, transpose_y=True)


def test_a_tied_head_the_paddle_model_computes_from_its_embedding_is_left_out_in_memory(tmp_path):
    """A rule set for tied and untied checkpoints maps the head (PaddleNLP's T5 rule set does);
    converting in memory for a paddle model without a head parameter leaves torch's tied copy
    out instead of stopping at 'not in the paddle model'."""
    import json

    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options
    rules = tmp_path / "tied.json"
    rules.write_text(json.dumps({"name": "tied", "rules": [
        {"kind": "rename", "key": "emb.weight", "to": "emb.weight"},
        {"kind": "rename", "key": "head.weight", "to": "head.weight"},
        {"kind": "transpose", "key": "head.weight"}]}))

    def torch_model():
        torch.manual_seed(0)
        return _TiedTorch()
    ids = np.random.default_rng(0).integers(0, 20, (2, 5))
    spec = spec_from_functions(torch_model, _TiedPaddle, lambda: (ids,), mapping=str(rules))
    report = verify(spec, Options(device="cpu"), bisect=True)
    assert report.verdict == "pass", report.first_bad
    torch_untied = torch_model()
    torch_untied.head.weight = torch.nn.Parameter(torch_untied.emb.weight.detach().clone())  # no tie: head kept
    from converter.errors import UserError
    with pytest.raises(UserError) as refused:
        verify(spec_from_functions(lambda: torch_untied, _TiedPaddle, lambda: (ids,), mapping=str(rules)),
               Options(device="cpu"))
    assert "target 'head.weight' (from 'head.weight') is not in the paddle model" in refused.value.render()


def test_merged_shape_is_only_a_merge_of_leading_axes():
    from converter.compare.matching import common_shape, merged_shape
    assert merged_shape((2, 12, 64), (24, 64)) == (24, 64) == merged_shape((24, 64), (2, 12, 64))
    assert merged_shape((3, 8, 64), (8, 3, 64)) is None  # the same sizes in another order: not a merge
    assert merged_shape((2, 768), (2, 12, 64)) is None  # trailing axes split: heads, not tokens
    assert merged_shape((2, 12, 64), (25, 64)) is None
    assert common_shape((1, 12, 64), (12, 64)) == (1, 12, 64)  # broadcasting first


class _TorchTokensFlat(torch.nn.Module):  # HF OPT's layer: the feed-forward runs on [B*T, H]
    def __init__(self):
        super().__init__()
        self.norm, self.fc1, self.fc2 = torch.nn.LayerNorm(16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, h):
        shape = h.shape
        h = h.reshape(-1, shape[-1])
        return (h + self.fc2(torch.relu(self.fc1(self.norm(h))))).view(shape)


class _PaddleTokens(paddle.nn.Layer):  # PaddleNLP's: on [B, T, H]
    def __init__(self, bias_bug: float = 0.0):
        super().__init__()
        self.norm, self.fc1, self.fc2 = paddle.nn.LayerNorm(16), paddle.nn.Linear(16, 32), paddle.nn.Linear(32, 16)
        self.bias_bug = bias_bug

    def forward(self, h):
        return h + self.fc2(paddle.nn.functional.relu(self.fc1(self.norm(h)))) + self.bias_bug


@pytest.mark.slow


def test_layers_that_see_the_tokens_flattened_on_one_side_are_compared_and_judged():
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options

    def torch_model():
        torch.manual_seed(0)
        return _TorchTokensFlat()
    x = np.random.default_rng(0).standard_normal((2, 6, 16)).astype(np.float32)
    clean = verify(spec_from_functions(torch_model, _PaddleTokens, lambda: (x,)), Options(device="cpu"), bisect=True)
    assert clean.verdict == "pass", clean.first_bad
    fc1 = next(r for r in clean.layers if r.torch == "fc1")
    assert fc1.ratio is not None and fc1.shape == (12, 32) and "leading axes merged" in fc1.note, fc1
    buggy = verify(spec_from_functions(torch_model, lambda: _PaddleTokens(1e-3), lambda: (x,)), Options(device="cpu"),
                   bisect=True)
    assert buggy.verdict == "fail" and buggy.first_bad.torch == "", buggy.first_bad  # the bug is the block's own code


class _TorchEnc(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)


class _PaddleEnc(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.lin = paddle.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) * 1.001  # the bug, in the encoder's own code


class _TorchEncDec(torch.nn.Module):  # the decoder starts on its own input and reads the encoder last
    def __init__(self):
        super().__init__()
        self.enc, self.dec_in, self.cross = _TorchEnc(), torch.nn.Linear(8, 8), torch.nn.Linear(16, 8)

    def forward(self, x, y):
        return self.cross(torch.cat([self.dec_in(y), self.enc(x)], -1))


class _PaddleEncDec(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.enc, self.dec_in, self.cross = _PaddleEnc(), paddle.nn.Linear(8, 8), paddle.nn.Linear(16, 8)

    def forward(self, x, y):
        return self.cross(paddle.concat([self.dec_in(y), self.enc(x)], -1))


def test_binary_search_looks_back_when_the_unit_it_finds_only_inherited_the_error():
    """Badness does not persist through a decoder that reads the encoder only at its end: the
    search finds the cross layer, whose own error is within budget, and probes the earlier
    units for the one the error came from."""
    _full_and_binary_name(_seeded(_TorchEncDec), _PaddleEncDec, "enc")


def _seeded(torch_class):
    def torch_model():
        torch.manual_seed(0)
        return torch_class()
    return torch_model


def _full_and_binary_name(torch_model, paddle_model, culprit: str):
    """Full capture and the binary search both name `culprit` on inputs x, y; the spec."""
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((2, 8)).astype(np.float32)
    spec = spec_from_functions(torch_model, paddle_model, lambda: (x, y))
    for strategy in ("full", "binary"):
        report = verify(spec, Options(device="cpu", strategy=strategy), bisect=True)
        assert report.first_bad is not None and report.first_bad.torch == culprit, (strategy, report.first_bad)
    return spec


class _TorchTwoStarts(torch.nn.Module):  # the decoder starts over on its own input, then reads the encoder
    def __init__(self):
        super().__init__()
        self.enc, self.dec_emb, self.dec_in = _TorchEnc(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.cross = torch.nn.Linear(16, 8)

    def forward(self, x, y):
        h = self.enc(x)
        return self.cross(torch.cat([self.dec_in(self.dec_emb(y)), h], -1))


class _PaddleScaled(paddle.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 1.001  # the same bug as _PaddleEnc's


class _PaddleTwoStarts(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.enc, self.dec_emb, self.dec_in = _PaddleEnc(), paddle.nn.Linear(8, 8), _PaddleScaled(8, 8)
        self.cross = paddle.nn.Linear(16, 8)

    def forward(self, x, y):
        h = self.enc(x)
        return self.cross(paddle.concat([self.dec_in(self.dec_emb(y)), h], -1))


def test_binary_search_names_the_first_copy_of_a_bug_when_a_later_unit_starts_over():
    """The same bug in the encoder and in the decoder's own code, where the decoder begins on its
    own input: the probe at the decoder's clean first layer clears only what that layer reads
    (nothing of the encoder), so the search goes back and names the encoder, as full capture does."""
    from converter.verify.dataflow import trace
    from converter.compare.session import Options, PortSession
    spec = _full_and_binary_name(_seeded(_TorchTwoStarts), _PaddleTwoStarts, "enc")
    with PortSession(spec, Options(device="cpu")) as session:
        flow = trace(session, ["enc", "dec_emb", "dec_in", "cross", ""])
    assert flow.reads["dec_emb"] == set() and flow.reads["dec_in"] == {"dec_emb"}
    assert flow.reads["cross"] is None  # its input is made by torch.cat, outside every module: every earlier unit
    assert flow.cleared_by(1) == set() and flow.cleared_by(2) == {1} and flow.cleared_by(3) is None


class _TorchIds(torch.nn.Module):  # integer ids from the model's input: no floating output to judge
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, y):
        return self.lin(y).argmax(-1)


class _PaddleIds(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.lin = paddle.nn.Linear(8, 8)

    def forward(self, y):
        return self.lin(y).argmax(-1)


class _TorchRestart(torch.nn.Module):
    """`enc` carries the bug first and `dec` again; the decoder's side starts over from `y` through
    a unit that returns a view (`emb`), a shared module's second call (`shared`, whose first call
    read the encoder), and beside an integer-only unit (`ids`)."""

    def __init__(self):
        super().__init__()
        self.ids, self.enc, self.shared = _TorchIds(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.emb, self.pre, self.dec = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(16, 8)
        self.table = torch.nn.Embedding(8, 8)

    def forward(self, x, y):
        ids = self.ids(y)
        a = self.shared(self.enc(x))
        start = self.shared(torch.tanh(self.emb(y)).view(2, 8)) if self.via_shared else torch.tanh(self.emb(y)).view(2, 8)
        return self.dec(torch.cat([self.pre(start), a], -1)) + self.table(ids)


class _PaddleRestart(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.ids, self.enc, self.shared = _PaddleIds(), _PaddleScaled(8, 8), paddle.nn.Linear(8, 8)
        self.emb, self.pre, self.dec = paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8), _PaddleScaled(16, 8)
        self.table = paddle.nn.Embedding(8, 8)

    def forward(self, x, y):
        ids = self.ids(y)
        a = self.shared(self.enc(x))
        start = self.shared(paddle.tanh(self.emb(y)).reshape([2, 8])) if self.via_shared else \
            paddle.tanh(self.emb(y)).reshape([2, 8])
        return self.dec(paddle.concat([self.pre(start), a], -1)) + self.table(ids)


@pytest.mark.parametrize("via_shared", [False, True])
@pytest.mark.slow
def test_binary_search_sees_through_views_shared_modules_and_integer_units(via_shared):
    """What a unit reads is traced through a view it returns and per call of a module called
    twice (the second call here reads only the model's input), and a unit with no floating
    output is never probed (its probe had nothing to judge and was called over budget): the
    search names the first copy of the bug, as full capture does."""
    def torch_model():
        m = _seeded(_TorchRestart)()
        m.via_shared = via_shared
        return m

    def paddle_model():
        m = _PaddleRestart()
        m.via_shared = via_shared
        return m
    _full_and_binary_name(torch_model, paddle_model, "enc")


@pytest.mark.parametrize("bug", ["4.bn2", "3.bn1", "1"])
@pytest.mark.slow
def test_in_place_operations_after_a_layer_do_not_change_what_was_recorded(bug):
    """torchvision's blocks change tensors in place after the layer that made them (`out += x`
    changes bn2's output, ReLU(inplace=True) bn1's and the stem BatchNorm's): the recorder sees
    the version counters move and records those calls again as copies, for the comparison and
    for the float64 reference alike, so a BatchNorm epsilon bug is named at its BatchNorm by full
    capture and binary search (before: the whole block, 'its own forward', or under binary the
    ReLU after the stem), and the clean port passes."""
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options
    x = np.random.default_rng(0).standard_normal((2, 8, 6, 6)).astype(np.float32)
    torch_model = lambda: resnet_like(True)
    clean = spec_from_functions(torch_model, lambda: resnet_like(False), lambda: (x,))
    buggy = spec_from_functions(torch_model, lambda: resnet_like(False, bug), lambda: (x,))
    for strategy in ("full", "binary"):
        if bug == "1":
            assert verify(clean, Options(device="cpu", strategy=strategy), bisect=True).verdict == "pass", strategy
        report = verify(buggy, Options(device="cpu", strategy=strategy), bisect=True)
        assert report.first_bad is not None and report.first_bad.torch == bug, (strategy, report.first_bad)
        assert "epsilon" in " ".join(d.cause for d in report.diagnosis).lower(), report.diagnosis


class _TorchShift(torch.nn.Module):  # adds its bias to its own input, in place, and returns it
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.linspace(-1, 1, 8))

    def forward(self, x):
        x.add_(self.bias)
        return x


class _PaddleShift(paddle.nn.Layer):
    def __init__(self, scale=1.0):
        super().__init__()
        self.bias = self.create_parameter([8])
        self.scale = scale

    def forward(self, x):
        x.add_(self.bias * self.scale)
        return x


@pytest.mark.slow


def test_a_layer_that_changes_its_own_input_in_place():
    """Both sides add in place to the tensor they are handed: the clean port passes (a copy of
    torch's input that paddle's layer changed holds what that layer computed, not torch's
    tensor), and a bug in it is named there without a dropout diagnosis (replays run on copies,
    so the diagnosis's repeated runs see the same input)."""
    def torch_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 8), _TorchShift(), torch.nn.Linear(8, 8))

    def paddle_model(scale):
        return lambda: paddle.nn.Sequential(paddle.nn.Linear(8, 8), _PaddleShift(scale), paddle.nn.Linear(8, 8))
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    for strategy in ("full", "binary"):
        clean = verify(spec_from_functions(torch_model, paddle_model(1.0), lambda: (x,)),
                       Options(device="cpu", strategy=strategy), bisect=True)
        assert clean.verdict == "pass", (strategy, clean.first_bad)
        buggy = verify(spec_from_functions(torch_model, paddle_model(1.05), lambda: (x,)),
                       Options(device="cpu", strategy=strategy), bisect=True)
        assert buggy.first_bad is not None and buggy.first_bad.torch == "1", (strategy, buggy.first_bad)
        assert not any("dropout" in d.cause for d in buggy.diagnosis), buggy.diagnosis


class _TorchInferenceMode(torch.nn.Module):  # its tensors keep no version counter
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.inference_mode():
            return self.b(self.a(x))


def test_a_torch_forward_under_inference_mode_is_verified():
    """Inference tensors raise when asked for their version counter: the in-place checks treat
    them as having none, under both strategies (full capture raised before)."""
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options

    class Twin(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.a, self.b = paddle.nn.Linear(4, 4), paddle.nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x))
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    spec = spec_from_functions(_seeded(_TorchInferenceMode), Twin, lambda: (x,))
    for strategy in ("full", "binary"):
        assert verify(spec, Options(device="cpu", strategy=strategy), bisect=True).verdict == "pass", strategy


class _TorchScaledBetween(torch.nn.Module):  # the parent scales between two layers
    def __init__(self):
        super().__init__()
        self.lin1, self.lin2, self.lin3 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin3(self.lin2(self.lin1(x) * 3.0))


class _PaddleScaledBetween(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.lin1, self.lin2, self.lin3 = paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin3(self.lin2(self.lin1(x) * 3.03))  # the bug, in the parent's own code


def test_a_layer_exact_on_torchs_inputs_gets_no_precision_diagnosis():
    """The binary search finds the first layer after the parent's wrong scale, whose own output on
    torch's inputs is exact: the precision check no longer calls a local error of 0 'over the fp32
    budget but consistent with TF32'; full capture names the parent's own forward."""
    from converter.spec import spec_from_functions
    from converter.verify.run import verify
    from converter.compare.session import Options
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    spec = spec_from_functions(_seeded(_TorchScaledBetween), _PaddleScaledBetween, lambda: (x,))
    full = verify(spec, Options(device="cpu", strategy="full"), bisect=True)
    assert full.first_bad.torch == "" and "own forward" in full.diagnosis[0].cause
    binary = verify(spec, Options(device="cpu", strategy="binary"), bisect=True)
    assert binary.verdict == "fail" and binary.first_bad is not None
    assert not any("consistent with" in d.cause for d in binary.diagnosis), binary.diagnosis


def test_an_error_in_our_own_hooks_is_not_blamed_on_the_model(monkeypatch):
    """A model whose forward raises is bad input (one line naming the model); an exception raised
    in this package's own hook code is left as it is, an internal error (exit 3 at the command
    line), not 'torch_model() fails on inputs()'."""
    from converter.errors import UserError
    from converter.spec import spec_from_functions
    from converter.compare import capture
    from converter.verify.run import verify
    from converter.compare.session import Options
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    spec = spec_from_functions(_seeded(_TorchScaledBetween), _PaddleScaledBetween, lambda: (x,))

    def broken(self, path, output, is_tensor):  # a bug inside the recorder's own code
        capture.Recorder.stale(None)
    monkeypatch.setattr(capture.Recorder, "_post", broken)
    with pytest.raises(AttributeError, match="_versions"):
        verify(spec, Options(device="cpu"))
    monkeypatch.undo()

    class Raises(_TorchScaledBetween):
        def forward(self, x):
            raise RuntimeError("the model's own bug")
    with pytest.raises(UserError, match="torch_model.. from .* fails on inputs.*the model's own bug"):
        verify(spec_from_functions(Raises, _PaddleScaledBetween, lambda: (x,)), Options(device="cpu"))
