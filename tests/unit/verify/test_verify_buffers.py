"""Persistable buffers a paddle port computes itself (a causal mask, position ids, rotary tables)
are not weights: they are not filled from torch's, stay as the paddle model built them, are named
in a note and compared with torch's buffer of the same name where torch has one."""

import numpy as np
import paddle
import torch

from helpers.cli import run_verify
from converter.inmemory import convert_in_memory
from converter.spec import spec_from_functions
from converter.verify.run import verify
from converter.compare.session import Options

T, H, VOCAB = 16, 8, 20


class TorchAttention(torch.nn.Module):
    """A causal self-attention as HF GPT-J keeps it: its mask and fill value are buffers that the
    state dict leaves out (persistent=False)."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(H, H) for _ in range(3))
        self.register_buffer("bias", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, T, T), persistent=False)
        self.register_buffer("masked_bias", torch.tensor(-1e9), persistent=False)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        n = x.shape[1]
        scores = q @ k.transpose(1, 2) / H ** 0.5
        scores = torch.where(self.bias[:, :n, :n], scores, self.masked_bias.to(scores.dtype))
        return torch.softmax(scores, -1) @ v


class TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.word = torch.nn.Embedding(VOCAB, H)
        self.position = torch.nn.Embedding(T, H)
        self.register_buffer("position_ids", torch.arange(T).expand(1, -1), persistent=False)
        self.attn = TorchAttention()

    def forward(self, ids):
        return self.attn(self.word(ids) + self.position(self.position_ids[:, :ids.shape[1]]))


class PaddleAttention(paddle.nn.Layer):
    """The port as PaddleNLP writes it: the same buffers, persistable (in its state dict), the mask
    in float; and a table of its own that torch has no counterpart of."""

    def __init__(self, masked=-1e9):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (paddle.nn.Linear(H, H) for _ in range(3))
        self.register_buffer("bias", paddle.tril(paddle.ones([T, T])).reshape([1, T, T]), persistable=True)
        self.register_buffer("masked_bias", paddle.to_tensor(masked, dtype="float32"), persistable=True)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (paddle.arange(0, H, 2, dtype="float32") / H),
                             persistable=True)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        n = x.shape[1]
        scores = q @ k.transpose([0, 2, 1]) / H ** 0.5
        scores = paddle.where(self.bias[:, :n, :n] > 0, scores, self.masked_bias.astype(scores.dtype))
        return paddle.nn.functional.softmax(scores, -1) @ v


class PaddleModel(paddle.nn.Layer):
    def __init__(self, masked=-1e9, extra_parameter=False):
        super().__init__()
        self.word = paddle.nn.Embedding(VOCAB, H)
        self.position = paddle.nn.Embedding(T, H)
        self.register_buffer("position_ids", paddle.arange(T, dtype="int64").expand([1, T]), persistable=True)
        self.attn = PaddleAttention(masked)
        if extra_parameter:  # a parameter torch has no tensor for: still an error
            self.scale = self.create_parameter([H])

    def forward(self, ids):
        return self.attn(self.word(ids) + self.position(self.position_ids[:, :ids.shape[1]]))


def _torch_model():
    torch.manual_seed(0)
    return TorchModel()


def _inputs():
    return {"ids": np.random.default_rng(0).integers(0, VOCAB, (2, 12)).astype("int64")}


def _spec(**paddle_kwargs):
    return spec_from_functions(_torch_model, lambda: PaddleModel(**paddle_kwargs), _inputs)


def test_a_port_with_persistable_buffers_passes_and_keeps_them():
    spec = _spec()
    paddle_model = spec.paddle_model()
    built = {k: np.array(v.numpy()) for k, v in paddle_model.state_dict().items()
             if k in ("position_ids", "attn.bias", "attn.masked_bias", "attn.inv_freq")}
    paddle_model.attn.inv_freq.set_value(paddle.full([H // 2], 0.5))  # what the port holds is kept, whatever it is
    built["attn.inv_freq"] = np.full(H // 2, 0.5, "float32")
    report = verify(spec, Options(device="cpu"), bisect=True)
    assert report.verdict == "pass", report.notes
    for key, value in built.items():
        assert np.array_equal(paddle_model.state_dict()[key].numpy(), value), key
    note = next(n for n in report.notes if "paddle state tensor(s) (buffers, parameters it does not train) that no torch tensor fills" in n)
    assert note.startswith("4 paddle state tensor(s)")
    assert "3 equal to torch's buffer of the same name (position_ids, attn.bias, attn.masked_bias)" in note
    assert "1 with no torch counterpart (attn.inv_freq)" in note


def test_the_in_memory_state_leaves_the_buffers_out_and_fills_every_parameter():
    torch_model, paddle_model = _torch_model(), PaddleModel()
    state, plan, _, _ = convert_in_memory(torch_model, paddle_model)
    params = {n for n, _ in paddle_model.named_parameters()}
    assert set(state) == params
    for name in params:
        t = torch_model.state_dict()[name].numpy()
        assert np.array_equal(state[name], t.T if name.endswith("proj.weight") else t), name


def test_a_buffer_that_differs_from_torchs_is_named_with_where():
    """PaddleNLP-like code filling with -1e4 where torch fills with -1e9: after softmax the same
    outputs (so the run passes), and the note says where the buffers differ."""
    report = verify(_spec(masked=-1e4), Options(device="cpu"))
    assert report.verdict == "pass"
    differs = [n for n in report.notes if n.startswith("paddle buffer 'attn.masked_bias'")]
    assert len(differs) == 1, report.notes
    assert "differs from torch's 'attn.masked_bias' in 1 of 1 element(s): paddle -10000, torch -1e+09" in differs[0]
    assert "1 differing (below)" in next(n for n in report.notes if "no torch tensor fills" in n)


def test_a_paddle_parameter_without_a_torch_source_is_kept_and_named_not_a_buffer():
    """A parameter no torch tensor fills is kept as built and named (verify-port measures whether the
    model reads it: test_one_sided_state.py); the buffers stay out of that list."""
    paddle_model = PaddleModel(extra_parameter=True)
    state, plan, _, _ = convert_in_memory(_torch_model(), paddle_model)
    assert "scale" not in state and [i.name for i in plan.unfilled] == ["scale"]
    assert "1 paddle parameter(s) that no torch tensor fills are left as the paddle model holds them: 'scale'" in plan.notes


def test_a_persistent_torch_buffer_still_fills_the_paddle_buffer_of_its_name():
    """A buffer torch saves (BatchNorm-like running statistics of a custom module) is a weight:
    the rules fill the paddle buffer from it."""

    class TorchScaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(H, H)
            self.register_buffer("running", torch.linspace(0.5, 2.0, H))

        def forward(self, x):
            return self.lin(x) * self.running

    class PaddleScaled(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = paddle.nn.Linear(H, H)
            self.register_buffer("running", paddle.ones([H]), persistable=True)

        def forward(self, x):
            return self.lin(x) * self.running

    torch_model, paddle_model = TorchScaled(), PaddleScaled()
    state, plan, _, _ = convert_in_memory(torch_model, paddle_model)
    assert np.array_equal(state["running"], torch_model.running.numpy())
    assert not any("no torch weight fills" in n for n in plan.notes)
    spec = spec_from_functions(lambda: torch_model, lambda: paddle_model,
                               lambda: (np.random.default_rng(1).standard_normal((2, H)).astype("float32"),))
    assert verify(spec, Options(device="cpu")).verdict == "pass"
    assert np.array_equal(paddle_model.running.numpy(), torch_model.running.numpy())


SPEC = '''
import sys
sys.path.insert(0, {here!r})
from test_verify_buffers import _torch_model as torch_model, _inputs as inputs, PaddleModel

def paddle_model():
    return PaddleModel()
'''


def test_verify_port_on_the_port_exits_0_with_the_note(tmp_path):
    import os
    spec = tmp_path / "buffers_spec.py"
    spec.write_text(SPEC.format(here=os.path.dirname(os.path.abspath(__file__))))
    r = run_verify("--spec", spec, "--device", "cpu")
    assert r.code == 0, r
    assert ("note: 4 paddle state tensor(s) (buffers, parameters it does not train) that no torch tensor fills are kept as "
            "the paddle model built them") in r.stdout
    assert "Skip loading" not in r.stderr + r.stdout


def test_a_paddle_sublayer_holding_only_its_own_buffers_does_not_upset_pairing_by_order():
    """torch's rotary module keeps its table out of the state dict, paddle's keeps it in: the
    paddle sublayer of the same name is not left over, and the Linears named differently on the
    two sides still pair by order."""

    class TorchRotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", torch.ones(H // 2), persistent=False)

    class PaddleRotary(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", paddle.ones([H // 2]), persistable=True)

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rotary = TorchRotary()
            self.fc = torch.nn.Linear(H, H)

        def forward(self, x):
            return self.fc(x) * self.rotary.inv_freq.repeat(2)

    class PaddleNet(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.rotary = PaddleRotary()
            self.proj = paddle.nn.Linear(H, H)

        def forward(self, x):
            return self.proj(x) * paddle.tile(self.rotary.inv_freq, [2])

    torch.manual_seed(2)
    torch_model = TorchNet()
    state, plan, _, _ = convert_in_memory(torch_model, PaddleNet())
    assert {e.name: e.parts[0].source for e in plan.entries} == {"proj.weight": "fc.weight", "proj.bias": "fc.bias"}
    assert np.array_equal(state["proj.weight"], torch_model.fc.weight.detach().numpy().T)
    assert any("equal to torch's buffer of the same name (rotary.inv_freq)" in n for n in plan.notes), plan.notes
    spec = spec_from_functions(lambda: torch_model, PaddleNet,
                               lambda: (np.random.default_rng(2).standard_normal((2, H)).astype("float32"),))
    assert verify(spec, Options(device="cpu")).verdict == "pass"


LOGITS_BIAS = np.linspace(-1.0, 1.0, H, dtype="float32")


class TorchBiased(torch.nn.Module):
    """HF BART's head: logits plus a bias the state dict saves (a persistent buffer)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(H, H)
        self.register_buffer("logits_bias", torch.from_numpy(LOGITS_BIAS.copy()))

    def forward(self, x):
        return self.lin(x) + self.logits_bias


class PaddleBiased(paddle.nn.Layer):
    def __init__(self, persistable: bool, value: float = 0.0):
        super().__init__()
        self.lin = paddle.nn.Linear(H, H)
        self.register_buffer("logits_bias", paddle.full([H], value), persistable=persistable)

    def forward(self, x):
        return self.lin(x) + self.logits_bias


def _biased_spec(paddle_model):
    torch.manual_seed(3)
    torch_model = TorchBiased()
    return spec_from_functions(lambda: torch_model, lambda: paddle_model,
                               lambda: (np.random.default_rng(3).standard_normal((2, H)).astype("float32"),))


def test_a_rule_onto_a_buffer_paddle_does_not_persist_is_named_not_refused():
    """The rules map torch's saved buffer onto a paddle buffer registered with persistable=False: no
    checkpoint reaches it. The plan leaves it out with a note, the run goes on, and the model's
    output is blamed on that buffer, with the fix."""
    paddle_model = PaddleBiased(persistable=False)
    report = verify(_biased_spec(paddle_model), Options(device="cpu"), bisect=True)
    assert report.verdict == "fail"
    assert report.first_bad.torch == "", report.first_bad
    note = next(n for n in report.notes if n.startswith("paddle buffer 'logits_bias' is not persistable"))
    assert "differs from torch's 'logits_bias' under the mapping in 8 of 8 element(s)" in note
    assert "paddle 0, torch -1" in note
    causes = [d.cause for d in report.diagnosis]
    assert any("'logits_bias' is not persistable, so the converted weights never reach it" in c for c in causes), causes
    assert np.array_equal(paddle_model.logits_bias.numpy(), np.zeros(H, "float32"))  # never written


def test_a_buffer_paddle_does_not_persist_but_builds_equal_passes():
    paddle_model = PaddleBiased(persistable=False)
    paddle_model.logits_bias.set_value(paddle.to_tensor(LOGITS_BIAS))
    report = verify(_biased_spec(paddle_model), Options(device="cpu"), bisect=True)
    assert report.verdict == "pass", report.notes
    assert any("'logits_bias' is not persistable" in n and "equal to torch's" in n for n in report.notes)


def test_a_persistable_paddle_buffer_is_filled_by_the_rule():
    paddle_model = PaddleBiased(persistable=True)
    report = verify(_biased_spec(paddle_model), Options(device="cpu"), bisect=True)
    assert report.verdict == "pass", report.notes
    assert not any("not persistable" in n for n in report.notes)
