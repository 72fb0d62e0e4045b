"""The run's memory plan from a checkpoint's header alone, no model built (compare/memory.py):
what each model holds by block, the in-memory and streamed peaks, and the one decision, fits,
streams, or is refused in one line (with --train: the training checks hold both models)."""

import pytest

from converter.compare import memory
from converter.errors import UserError
from converter.io.base import TensorInfo

MiB = 1 << 20


def _llama_like(layers=4, width=512):
    """A header: an embedding outside the blocks, `layers` blocks of two float32 matrices, an int buffer."""
    infos = {"model.embed_tokens.weight": TensorInfo("model.embed_tokens.weight", "float32", (1000, width)),
             "model.ids": TensorInfo("model.ids", "int64", (1000,))}
    for i in range(layers):
        for name in ("q", "mlp"):
            key = f"model.layers.{i}.{name}.weight"
            infos[key] = TensorInfo(key, "float32", (width, width))
    return infos


def test_a_model_holds_its_blocks_apart_from_the_rest():
    held = memory.held_from_header(_llama_like())
    block = 2 * 512 * 512 * 4
    assert held.blocks == [block] * 4 and held.outside == 1000 * 512 * 4 + 1000 * 8
    assert held.whole == held.outside + 4 * block and held.streamed(2) == held.outside + 2 * block
    wide = memory.held_from_header(_llama_like(), width=8)  # the float64 reference: integers counted with the model
    assert wide.blocks == [2 * block] * 4 and wide.outside == 1000 * 512 * 8
    assert memory.held_from_header(_llama_like(), "bfloat16").blocks == [block // 2] * 4


def test_the_streamed_run_needs_less_than_the_in_memory_run():
    planned = memory.before_build(_llama_like(layers=8), 64 * MiB)
    assert planned.streamed.peak < planned.in_memory_peak
    assert planned.in_memory.models == 2 * memory.held_from_header(_llama_like(layers=8)).whole  # torch's and paddle's


def test_one_decision_fits_streams_or_refuses():
    infos = _llama_like(layers=8)
    roomy = memory.before_build(infos, 1 << 34)
    assert roomy.must_stream(1 << 34, "test", "verify-port", train=False, cannot_stream=None) is None
    tight = memory.before_build(infos, 1)  # the peaks at the least room: streamed needs less than in memory
    between = (tight.streamed.peak + tight.in_memory_peak) // 2
    planned = memory.before_build(infos, between)
    assert planned.streamed.peak <= between < planned.in_memory_peak  # streams, though it does not fit whole
    need = planned.must_stream(between, "test", "verify-port", train=False, cannot_stream=None)
    assert need.startswith("in memory the run needs about")
    with pytest.raises(UserError, match="the training checks hold both models: run without --train"):
        planned.must_stream(between, "test", "verify-port", train=True, cannot_stream=None)
    with pytest.raises(UserError, match="save the checkpoint as safetensors"):
        planned.must_stream(between, "test", "verify-port", train=False, cannot_stream="save the checkpoint as safetensors")
    with pytest.raises(UserError, match="with both models' weights streamed block by block it needs about"):
        tight.must_stream(1, "test", "verify-port", train=False, cannot_stream=None)
