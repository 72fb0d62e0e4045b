"""Layer-streamed verification of a torch model whose buffers are computed by its own code (a
rotary table, position ids, a causal mask: kept out of the state dict) and one persistent buffer
that the checkpoint holds. Built on the meta device (`with torch.device("meta")` in torch_model(),
or converter's parameters_on_meta()), the computed buffers are made on the CPU by the model's
code and the parameters stream from --weights: the rows are those of the in-memory run bit for
bit, and the persistent buffer takes the checkpoint's values. A buffer that is on the meta device
and not in the checkpoint is one line naming it."""

import numpy as np
import paddle
import pytest
import torch
from safetensors.torch import save_file

from converter.compare.build import parameters_on_meta
from converter.compare.session import Options
from converter.errors import UserError
from converter.spec import spec_from_functions
from converter.verify.run import verify

H, HEADS, VOCAB, LAYERS, SEQ, MAX_POS = 32, 4, 64, 3, 8, 16
DIM = H // HEADS
BASE = 10000.0


def _rotate(x, cos, sin, cat, split):
    a, b = split(x)
    return x * cos + cat(-b, a) * sin


class TorchRotary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        inv_freq = 1.0 / (BASE ** (torch.arange(0, DIM, 2, dtype=torch.float32) / DIM))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions):
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        angles = torch.cat([freqs, freqs], -1)
        return angles.cos(), angles.sin()


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(H, 3 * H, bias=False)
        self.out = torch.nn.Linear(H, H, bias=False)
        self.up, self.down = torch.nn.Linear(H, 2 * H), torch.nn.Linear(2 * H, H)
        self.register_buffer("causal", torch.ones(MAX_POS, MAX_POS, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, HEADS, DIM).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        halves = lambda z: z.chunk(2, -1)
        cat = lambda u, w: torch.cat([u, w], -1)
        q, k = _rotate(q, cos, sin, cat, halves), _rotate(k, cos, sin, cat, halves)
        scores = (q @ k.transpose(-1, -2)) / DIM ** 0.5
        scores = scores.masked_fill(~self.causal[:t, :t], -1e9)
        x = x + self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, H))
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Rope:
    """The forward of both models: the embeddings, the rotary table of the positions, each block in
    turn, the head of the scaled states."""

    def forward(self, input_ids):
        x = self.embed(input_ids)
        cos, sin = self.rotary(self.position_ids[:input_ids.shape[1]])
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(x * self.scale)


class TorchRope(Rope, torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, H)
        self.rotary = TorchRotary()
        self.layers = torch.nn.ModuleList([TorchBlock() for _ in range(LAYERS)])
        self.register_buffer("position_ids", torch.arange(MAX_POS), persistent=False)
        self.register_buffer("scale", torch.ones(H))  # persistent: the checkpoint's values count
        self.head = torch.nn.Linear(H, VOCAB, bias=False)


class PaddleRotary(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        inv_freq = 1.0 / (BASE ** (paddle.arange(0, DIM, 2, dtype="float32") / DIM))
        self.register_buffer("inv_freq", inv_freq, persistable=False)

    def forward(self, positions):
        freqs = positions[:, None].astype("float32") * self.inv_freq[None, :]
        angles = paddle.concat([freqs, freqs], -1)
        return angles.cos(), angles.sin()


class PaddleBlock(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.qkv = paddle.nn.Linear(H, 3 * H, bias_attr=False)
        self.out = paddle.nn.Linear(H, H, bias_attr=False)
        self.up, self.down = paddle.nn.Linear(H, 2 * H), paddle.nn.Linear(2 * H, H)
        self.register_buffer("causal", paddle.tril(paddle.ones([MAX_POS, MAX_POS])).astype("bool"), persistable=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = (z.reshape([b, t, HEADS, DIM]).transpose([0, 2, 1, 3]) for z in self.qkv(x).chunk(3, -1))
        halves = lambda z: z.chunk(2, -1)
        cat = lambda u, w: paddle.concat([u, w], -1)
        q, k = _rotate(q, cos, sin, cat, halves), _rotate(k, cos, sin, cat, halves)
        scores = (q @ k.transpose([0, 1, 3, 2])) / DIM ** 0.5
        scores = paddle.where(self.causal[:t, :t], scores, paddle.full_like(scores, -1e9))
        ctx = paddle.nn.functional.softmax(scores, -1) @ v
        x = x + self.out(ctx.transpose([0, 2, 1, 3]).reshape([b, t, H]))
        return x + self.down(paddle.nn.functional.gelu(self.up(x)))


class PaddleRope(Rope, paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, H)
        self.rotary = PaddleRotary()
        self.layers = paddle.nn.LayerList([PaddleBlock() for _ in range(LAYERS)])
        self.register_buffer("position_ids", paddle.arange(MAX_POS), persistable=False)
        self.register_buffer("scale", paddle.ones([H]))
        self.head = paddle.nn.Linear(H, VOCAB, bias_attr=False)


def inputs():
    return {"input_ids": np.random.default_rng(3).integers(0, VOCAB, (2, SEQ)).astype("int64")}


def lazy_paddle():
    with paddle.LazyGuard():
        return PaddleRope()


def under_device_meta():
    with torch.device("meta"):
        return TorchRope().eval()


def under_parameters_on_meta():
    with parameters_on_meta():
        return TorchRope().eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The model's state dict (no computed buffer in it), its persistent buffer not what the model computes."""
    torch.manual_seed(0)
    model = TorchRope()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        model.scale.copy_(torch.linspace(0.5, 1.5, H))
    state = model.state_dict()
    assert "scale" in state and not any(k.endswith(("inv_freq", "causal", "position_ids")) for k in state)
    path = tmp_path_factory.mktemp("buffers") / "rope.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return str(path)


@pytest.mark.parametrize("build", [under_device_meta, under_parameters_on_meta])
def test_buffers_the_model_computes_are_made_and_the_rows_are_the_in_memory_ones(checkpoint, build):
    options = Options(device="cpu", strategy="full")
    in_memory = verify(spec_from_functions(TorchRope, lazy_paddle, inputs), options, weights=checkpoint, bisect=True)
    built = {}

    def torch_model():
        built["model"] = build()
        return built["model"]
    streamed = verify(spec_from_functions(torch_model, lazy_paddle, inputs), options, weights=checkpoint, bisect=True)
    assert any("streamed from" in n for n in streamed.notes)
    assert [repr(r) for r in streamed.layers] == [repr(r) for r in in_memory.layers] and streamed.layers
    assert repr(streamed.outputs) == repr(in_memory.outputs)
    assert streamed.first_bad is None and in_memory.first_bad is None
    model, reference = built["model"], TorchRope()
    assert all(p.is_meta for p in model.parameters())  # streamed, and put back after the run
    for name in ("rotary.inv_freq", "position_ids", "layers.2.causal"):
        assert torch.equal(model.get_buffer(name), reference.get_buffer(name)), name
    assert torch.equal(model.scale, torch.ones(H))  # the checkpoint's values held for the run only


def test_a_planted_bug_beside_computed_buffers_is_named(checkpoint):
    class Shifted(PaddleRope):  # its rotary table from another base
        def __init__(self):
            super().__init__()
            self.rotary.inv_freq = 1.0 / (500.0 ** (paddle.arange(0, DIM, 2, dtype="float32") / DIM))

    def lazy_shifted():
        with paddle.LazyGuard():
            return Shifted()
    report = verify(spec_from_functions(under_device_meta, lazy_shifted, inputs), Options(device="cpu", strategy="full"),
                    weights=checkpoint, bisect=True)
    assert report.first_bad is not None and report.first_bad.torch == "rotary"


class TorchDerived(TorchRope):
    """A buffer made from a parameter: on the meta device when the parameter is, and in no checkpoint."""

    def __init__(self):
        super().__init__()
        self.register_buffer("head_norms", self.head.weight.detach().norm(dim=1), persistent=False)


def test_a_buffer_that_can_be_neither_read_nor_computed_is_one_line(checkpoint):
    def torch_model():
        with torch.device("meta"):
            return TorchDerived()
    with pytest.raises(UserError) as caught:
        verify(spec_from_functions(torch_model, lazy_paddle, inputs), Options(device="cpu"), weights=checkpoint)
    said = str(caught.value)
    assert "\n" not in said and "'head_norms'" in said and "neither read nor computed" in said, said


def test_parameters_on_meta_keeps_a_model_built_with_the_cpu_as_it_is():
    torch.manual_seed(5)
    with parameters_on_meta():
        meta = TorchRope()
    with torch.device("cpu"):
        torch.manual_seed(5)
        plain = TorchRope()
    from converter.compare.build import computed_buffers
    torch.manual_seed(5)
    with computed_buffers():
        kept = TorchRope()
    assert all(p.is_meta for p in meta.parameters()) and not any(b.is_meta for b in meta.buffers())
    for (name, a), (_, b) in zip(plain.state_dict().items(), kept.state_dict().items()):
        assert torch.equal(a, b), name
    assert all(not p.is_meta for p in kept.parameters())
