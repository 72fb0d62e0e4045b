"""The float64 reference widened block by block (compare/widen.py) computes what a plain
`.double()` copy of the model computes, bit for bit, and holds at most the tensors outside the
model's blocks and two blocks at once."""

import copy
import threading

import torch
import torch.nn.functional as F

from converter.compare.widen import Float64Reference

WIDTH, HEADS, VOCAB, LAYERS = 32, 4, 50, 5


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x, bias):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, HEADS, -1).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        logits = q @ k.transpose(-1, -2) / (WIDTH // HEADS) ** 0.5 + bias
        return self.o((logits.softmax(-1) @ v).transpose(1, 2).reshape(b, t, WIDTH))


class Layer(torch.nn.Module):
    def __init__(self, shared_gate):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)
        self.gate = shared_gate  # one module in every layer, called twice in each
        self.scale = torch.nn.Parameter(torch.rand(WIDTH) + 0.5)  # read by the layer itself, no module call

    def forward(self, x, bias):
        x = x + self.attn(self.norm1(x), bias)
        h = self.norm2(x)
        h = F.linear(F.gelu(self.up(h)), self.down.weight) + self.down.bias  # a child's weight read directly
        return self.gate(self.gate(x + h * self.scale))


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        gate = torch.nn.Linear(WIDTH, WIDTH)
        self.layers = torch.nn.ModuleList(Layer(gate) for _ in range(LAYERS))
        self.rel = torch.nn.Embedding(7, HEADS)  # read by the encoder without calling it (DeBERTa's rel_embeddings)

    def forward(self, x):
        t = x.shape[1]
        distance = (torch.arange(t)[None, :] - torch.arange(t)[:, None]).clamp(-3, 3) + 3
        bias = self.rel.weight[distance].permute(2, 0, 1)[None]
        for layer in self.layers:
            x = layer(x, bias)
        return x


class Model(torch.nn.Module):
    """A small transformer whose head is tied to its embedding."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.encoder = Encoder()
        self.final = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.tensor(3))

    def forward(self, ids):
        return self.head(self.final(self.encoder(self.embed(ids)))) * self.steps


def _model():
    torch.manual_seed(0)
    model = Model().eval()
    with torch.no_grad():  # LayerNorms away from their initial ones and zeros: a wrong tensor shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _ids(seed=1):
    return torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(seed))


def _materialized(model) -> int:
    """Bytes of the model's tensors that hold data (each storage once; a placeholder's single
    element is no tensor's data)."""
    storages = {}
    for t in [*model.parameters(), *model.buffers()]:
        storage = t.untyped_storage()
        if storage.nbytes() > t.element_size():
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def test_the_reference_equals_a_double_copy_bit_for_bit_and_leaves_the_model_alone():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plain = copy.deepcopy(model).double()
    ref = Float64Reference(model)
    assert ref.blocks == LAYERS
    with torch.no_grad():
        for seed in (1, 2):  # a second run starts with the last blocks widened and the first dropped
            assert torch.equal(ref.model(_ids(seed)), plain(_ids(seed)))
    for key, value in model.state_dict().items():
        assert value.dtype == before[key].dtype and torch.equal(value, before[key]), key
    assert ref.model.head.weight is ref.model.embed.weight and ref.model.embed.weight.dtype == torch.float64
    assert ref.model.encoder.layers[0].gate is ref.model.encoder.layers[3].gate
    assert ref.model.steps.dtype == torch.int64 and int(ref.model.steps) == 3


def test_a_call_into_the_middle_of_a_block_widens_its_block():
    model = _model()
    plain = copy.deepcopy(model).double()
    ref = Float64Reference(model)
    x = torch.randn(2, 9, WIDTH, dtype=torch.float64)
    bias = torch.randn(1, HEADS, 9, 9, dtype=torch.float64)
    with torch.no_grad():
        ref.model(_ids())  # the last two blocks widened, the first dropped
        assert 1 not in ref.widened_blocks()
        assert torch.equal(ref.model.encoder.layers[1].attn(x, bias), plain.encoder.layers[1].attn(x, bias))
        assert torch.equal(ref.model.encoder.layers[1].norm2(x), plain.encoder.layers[1].norm2(x))
        assert torch.equal(ref.model.encoder.layers[0](x, bias), plain.encoder.layers[0](x, bias))
        assert torch.equal(ref.model.encoder.layers[1](x, bias), plain.encoder.layers[1](x, bias))
    assert sorted(ref.widened_blocks()) == [0, 1]


def test_it_holds_the_tensors_outside_the_blocks_and_two_blocks_at_most():
    model = _model()
    ref = Float64Reference(model)
    layer = sum(p.numel() for p in model.encoder.layers[0].parameters()) * 8  # the shared gate counted in each
    inside = {id(p) for m in model.encoder.layers for p in m.parameters()}
    outside = sum(p.numel() for p in model.parameters() if id(p) not in inside) * 8
    whole = sum(p.numel() for p in model.parameters()) * 8
    seen = []
    for block in ref.model.encoder.layers:
        block.register_forward_hook(lambda *_: seen.append(_materialized(ref.model)))
    with torch.no_grad():
        ref.model(_ids())
    assert len(seen) == LAYERS
    assert ref.most_bytes() == (outside, 2 * layer)
    assert _materialized(ref.model) <= outside + 2 * layer
    assert max(seen) <= outside + 2 * layer < whole
    assert min(seen) >= outside + layer  # the block that just ran is widened


def test_held_within_an_allowance_that_holds_every_block_it_widens_each_once():
    model = _model()
    ref = Float64Reference(model)
    layer = sum(p.numel() for p in model.encoder.layers[0].parameters()) * 8  # the shared gate counted in each
    assert ref.tensors.hold_within(LAYERS * layer - 1) == 2  # not all of them: as it was, not some more
    made = []
    record = ref.tensors._blocks[0][0]
    make = record.make
    record.make = lambda: made.append(1) or make()
    with torch.no_grad():
        first = ref.model(_ids())
        assert len(ref.widened_blocks()) == 2 and len(made) == 1
        assert ref.tensors.hold_within(LAYERS * layer) == LAYERS
        ref.model(_ids())
        kept = ref.widened_blocks()
        again = ref.model(_ids())  # every block held: none is widened again
    assert sorted(kept) == list(range(LAYERS)) and sorted(ref.widened_blocks()) == kept
    assert len(made) == 2  # the first run dropped it; the second widened it once for both
    assert torch.equal(first, again)
    assert torch.equal(again, copy.deepcopy(model).double()(_ids()))


def test_two_threads_running_it_at_once_get_the_double_copys_outputs():
    model = _model()
    plain = copy.deepcopy(model).double()
    ref = Float64Reference(model, keep=1)  # dropping as often as possible
    expected = {seed: plain(_ids(seed)) for seed in range(4)}
    wrong = []

    def run(seeds):
        with torch.no_grad():
            for seed in seeds:
                if not torch.equal(ref.model(_ids(seed)), expected[seed]):
                    wrong.append(seed)

    threads = [threading.Thread(target=run, args=([0, 1, 2, 3] * 3,)), threading.Thread(target=run, args=([3, 2, 1, 0] * 3,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert len(ref.widened_blocks()) <= 2  # the one this thread holds, and what the other threads held when they ended


def test_a_model_without_a_list_of_layers_is_widened_whole():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ref = Float64Reference(model)
    x = torch.randn(5, 4, dtype=torch.float64)
    assert ref.blocks == 0
    with torch.no_grad():
        assert torch.equal(ref.model(x), copy.deepcopy(model).double()(x))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_what_a_dropped_block_freed_goes_back_to_the_system():
    import pytest

    from converter.compare import widen
    if widen._malloc_trim() is None:
        pytest.skip("the C library is not glibc")
    import numpy as np
    pieces = [np.ones(64 << 10, np.uint8) for _ in range(4096)]  # 256 MiB in chunks glibc keeps in its heap
    last = pieces[-1]
    del pieces  # freed, below the last one: glibc keeps the pages
    held = _rss()
    widen.give_back_freed()
    assert _rss() < held - (128 << 20), (held, _rss())
    assert last.sum() == 64 << 10
