"""A spec run with --weights switches to streaming both models' weights when the estimate made
from the checkpoint's header, before any model is built, says the in-memory run would not fit:
torch_model() is built with its parameters on the meta device and paddle_model() under
paddle.LazyGuard(), the rows are the in-memory run's bit for bit, and the report says why it
streams. A paddle weights file given with --converted is streamed too, and under mapping 'loaded'
each of its tensors is checked bit for bit against torch's first. A run that fits neither way
stops before torch_model() is called. The memory available is set to figures between the two
estimates (compare/memory.py's available_memory, which the estimate reads)."""

import resource

import numpy as np
import paddle
import pytest
import torch
from safetensors.torch import save_file

from converter.compare.session import Options, PortSession
from converter.inmemory import convert_in_memory
from converter.errors import UserError
from converter.io import open_source
from converter.io.base import TensorInfo
from converter.io.pdparams import write_pdparams
from converter.spec import LOADED, spec_from_functions
from converter.compare import memory
from converter.verify.run import verify

H, FFN, VOCAB, LAYERS, SEQ = 256, 1024, 80, 6, 8


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(H)
        self.up, self.down = torch.nn.Linear(H, FFN), torch.nn.Linear(FFN, H)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class Stacked:
    """The forward of both stacks: the embeddings, each block in turn, the head."""

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class TorchStack(Stacked, torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, H)
        self.layers = torch.nn.ModuleList([TorchBlock() for _ in range(LAYERS)])
        self.head = torch.nn.Linear(H, VOCAB)


class PaddleBlock(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.norm = paddle.nn.LayerNorm(H)
        self.up, self.down = paddle.nn.Linear(H, FFN), paddle.nn.Linear(FFN, H)

    def forward(self, x):
        return x + self.down(paddle.tanh(self.up(self.norm(x))))


class PaddleStack(Stacked, paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, H)
        self.layers = paddle.nn.LayerList([PaddleBlock() for _ in range(LAYERS)])
        self.head = paddle.nn.Linear(H, VOCAB)


def inputs():
    return {"input_ids": np.random.default_rng(7).integers(0, VOCAB, (2, SEQ)).astype("int64")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The torch checkpoint (safetensors, torch's zip format, and a .pt of its format before zip files)
    and the paddle weights converted from it."""
    torch.manual_seed(1)
    model = TorchStack()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    root = tmp_path_factory.mktemp("switch")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(root / "stack.safetensors"))
    torch.save(state, str(root / "stack.pt"), _use_new_zipfile_serialization=False)  # read whole by torch.load
    torch.save(state, str(root / "stack-zip.pt"))
    converted, _, _, _ = convert_in_memory(model, PaddleStack())
    _write_pdparams(root / "stack.pdparams", converted)
    return {"safetensors": str(root / "stack.safetensors"), "pt": str(root / "stack.pt"), "zip": str(root / "stack-zip.pt"),
            "pdparams": str(root / "stack.pdparams")}


def _write_pdparams(path, arrays):
    with open(path, "wb") as f:
        write_pdparams(f, [TensorInfo(k, str(v.dtype), v.shape) for k, v in arrays.items()], lambda i: arrays[i.name])


def _between(weights, converted=None):
    """A figure of memory available where the run fits streamed and not in memory."""
    with open_source(weights) as source:
        infos = dict(source.infos)
    paddle_infos = None
    if converted:
        with open_source(converted) as source:
            paddle_infos = dict(source.infos)
    low, high = 1, 1 << 40  # the least figure where the streamed run fits
    while high - low > 1:
        mid = (low + high) // 2
        fits = memory.before_build(infos, mid, paddle_infos=paddle_infos).streamed.peak <= mid
        low, high = (low, mid) if fits else (mid, high)
    planned = memory.before_build(infos, high, paddle_infos=paddle_infos)
    assert planned.in_memory_peak > high  # streaming saves the layers beyond two per side
    return high


def _available(monkeypatch, figure):
    monkeypatch.setattr(memory, "available_memory", lambda cap=None: (figure, "the figure this test sets"))


def _rows(report):
    return [repr(r) for r in report.layers]


def _spec(built, mapping=None):
    def torch_model():
        built["torch"] = TorchStack()
        return built["torch"]

    def paddle_model():
        built["paddle"] = PaddleStack()
        return built["paddle"]
    return spec_from_functions(torch_model, paddle_model, inputs, mapping)


@pytest.mark.parametrize("kind", ["safetensors", "zip"])
def test_a_run_that_would_not_fit_in_memory_streams_and_gives_the_in_memory_rows(files, monkeypatch, kind):
    options = Options(device="cpu", strategy="full")
    in_memory = verify(_spec({}), options, weights=files[kind], bisect=True)
    assert not any("streamed" in n for n in in_memory.notes)
    _available(monkeypatch, _between(files[kind]))
    built = {}
    streamed = verify(_spec(built), options, weights=files[kind], bisect=True)
    assert _rows(streamed) == _rows(in_memory) and streamed.layers
    assert repr(streamed.outputs) == repr(in_memory.outputs) and streamed.first_bad is None
    why = [n for n in streamed.notes if n.startswith("weights: streamed block by block")]
    assert len(why) == 1 and "in memory the run needs about" in why[0] and "the figure this test sets" in why[0], \
        streamed.notes
    assert all(p.is_meta for p in built["torch"].parameters())  # built with its parameters on the meta device
    assert not any(p._is_initialized() for p in built["paddle"].parameters())  # built lazily, given back so


@pytest.mark.parametrize("planted", [False, True])
def test_paddle_weights_given_with_converted_stream_and_are_checked_one_tensor_at_a_time(files, monkeypatch, tmp_path,
                                                                                        planted):
    converted = files["pdparams"]
    if planted:
        with open_source(converted) as source:
            arrays = {k: np.array(source.read(k)) for k in source.infos}
        arrays["layers.3.up.weight"][5, 9] += 0.125
        converted = str(tmp_path / "planted.pdparams")
        _write_pdparams(converted, arrays)
    options = Options(device="cpu", strategy="full")
    in_memory = verify(_spec({}, LOADED), options, weights=files["safetensors"], converted=converted, bisect=True)
    _available(monkeypatch, _between(files["safetensors"], converted))
    built = {}
    streamed = verify(_spec(built, LOADED), options, weights=files["safetensors"], converted=converted, bisect=True)
    assert any("the paddle model's from" in n for n in streamed.notes), streamed.notes
    assert streamed.weights.checked == in_memory.weights.checked == 6 * LAYERS + 3  # every tensor
    assert [d.to_json() for d in streamed.weights.differ] == [d.to_json() for d in in_memory.weights.differ]
    assert _rows(streamed) == _rows(in_memory) and streamed.verdict == in_memory.verdict
    if planted:
        (differ,) = streamed.weights.differ
        assert differ.paddle == "layers.3.up.weight" and differ.index == (5, 9) and differ.differ == 1
        assert streamed.first_bad is not None and streamed.first_bad.torch.startswith("layers.3")
    else:
        assert not streamed.weights.differ and streamed.first_bad is None


def test_a_run_that_fits_neither_way_stops_before_the_models_are_built(files, monkeypatch):
    _available(monkeypatch, 4096)
    built = {}
    with pytest.raises(UserError) as caught:
        verify(_spec(built), Options(device="cpu"), weights=files["safetensors"])
    said = str(caught.value)
    assert "\n" not in said and "with both models' weights streamed block by block it needs about" in said, said
    assert built == {}  # neither model was built


def test_a_checkpoint_that_cannot_stream_is_said_so_before_the_models_are_built(files, monkeypatch):
    _available(monkeypatch, _between(files["safetensors"]))
    built = {}
    with pytest.raises(UserError) as caught:
        verify(_spec(built), Options(device="cpu"), weights=files["pt"])
    said = str(caught.value)
    assert "\n" not in said and "in memory the run needs about" in said and "one tensor at a time" in said, said
    assert built == {}


@pytest.mark.parametrize("converted", [False, True])
def test_paddles_float64_copy_holds_the_weights_the_paddle_model_runs_with(files, monkeypatch, converted):
    """The float64 copy that measures paddle's own drift is streamed from the plan only where the
    paddle model's weights come from the plan: where they are read from a file, a copy from the plan
    would hold other weights (a planted difference would count as drift), and none is made."""
    given = files["pdparams"] if converted else None
    _available(monkeypatch, _between(files["safetensors"], given))
    with PortSession(_spec({}), Options(device="cpu"), weights=files["safetensors"], converted=given) as session:
        assert session.streams["paddle"] is not None
        wide = session.paddle64_outputs(["head"])
        if converted:
            assert wide is None
        else:
            (y,) = wide["head"]
            assert y.dtype == np.float64 and y.shape == (2, SEQ, VOCAB)


def test_a_run_given_less_memory_than_it_needs_in_memory_streams_within_it(files, monkeypatch):
    """Options.max_memory (--max-memory): the most the process may hold. What it leaves beside what
    the process holds is the memory available, on a machine with room to spare: a run that would
    not fit in it streams, with the in-memory run's rows. What the process holds is set to a figure
    (the window between the two estimates is a few MB here, less than a set-up's allocations move
    the resident set by); the measured one is what /proc says."""
    options = Options(device="cpu", strategy="full")
    in_memory = verify(_spec({}), options, weights=files["safetensors"], bisect=True)
    with open_source(files["safetensors"]) as source:
        infos = dict(source.infos)
    low = _between(files["safetensors"])  # the least figure where the streamed run fits
    room = low + (memory.before_build(infos, low).in_memory_peak - low) // 2  # and the in-memory run does not
    assert memory.before_build(infos, room).in_memory_peak > room >= memory.before_build(infos, room).streamed.peak
    built = {}
    held = memory.resident_bytes()
    assert 0 < held <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    monkeypatch.setattr(memory, "resident_bytes", lambda: held)
    capped = Options(device="cpu", strategy="full", max_memory=held + room)
    streamed = verify(_spec(built), capped, weights=files["safetensors"], bisect=True)
    assert _rows(streamed) == _rows(in_memory) and repr(streamed.outputs) == repr(in_memory.outputs)
    why = [n for n in streamed.notes if n.startswith("weights: streamed block by block")]
    assert len(why) == 1 and "by --max-memory" in why[0] and "this process holds" in why[0], streamed.notes
    assert all(p.is_meta for p in built["torch"].parameters())


def test_training_with_weights_too_large_for_memory_is_refused_in_one_line_before_the_models_are_built(files):
    """verify-port --spec S --weights W --train with W too large for --max-memory: the training
    checks hold both models, so the run is refused before torch_model() is called (the forward check
    alone streams). --max-memory of a byte leaves no memory beside what the process holds."""
    from converter.api import VerifyOptions, verify_port
    built = {}
    with pytest.raises(UserError) as caught:
        verify_port(_spec(built), VerifyOptions(device="cpu", train=True, max_memory=1), weights=files["safetensors"])
    said = str(caught.value)
    assert "\n" not in said and said.startswith("verify-port --train: in memory the run needs about"), said
    assert "by --max-memory" in said and "run without --train" in said, said
    assert built == {}  # neither model was built


def test_training_a_torch_model_built_on_the_meta_device_is_refused_before_the_paddle_model_is_built(files):
    """A torch_model() built on the meta device streams its weights whatever the memory: with --train
    it is refused in one line, and the paddle model is not built."""
    from converter.api import VerifyOptions, verify_port
    built = {}

    def torch_model():
        with torch.device("meta"):
            built["torch"] = TorchStack()
        return built["torch"]

    def paddle_model():
        built["paddle"] = PaddleStack()
        return built["paddle"]
    spec = spec_from_functions(torch_model, paddle_model, inputs)
    with pytest.raises(UserError) as caught:
        verify_port(spec, VerifyOptions(device="cpu", train=True), weights=files["safetensors"])
    said = str(caught.value)
    assert "\n" not in said and said.startswith("verify-port --train: torch_model() from") and "meta device" in said, said
    assert list(built) == ["torch"]  # refused before paddle_model() was called
