"""The forward check's pairing of the training models (compare/align.py: the same path, the
conversion plan, fused layers, the same kind of layer in execution order), made once on copies of
the models run on the spec's inputs; the per-layer backward and the structure phase read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..compare.capture import Recorder, record
from ..compare.session import _forward_errors
from ..frameworks import paddle_side, torch_side

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only
    from .session import TrainSession


@dataclass(frozen=True)
class LayerPairs:
    """modules: torch module path -> paddle layer path ("" -> "": the models themselves); fused:
    paddle layer path -> ((torch module path, its Slice), ...) for each paddle layer that fuses
    several torch modules (q|k|v, gate|up), the modules in the plan's order."""

    modules: dict
    fused: dict


def pair_layers(session: TrainSession) -> LayerPairs:
    from ..compare.align import align
    from ..compare.fused import Slice
    calls = []
    for side, model, which in ((torch_side, session.run_only_copy("torch"), "torch_model()"),
                               (paddle_side, session.run_only_copy("paddle"), "paddle_model()")):
        recorder = record(side, model, Recorder())
        try:
            with _forward_errors(f"{which} in training mode", session.spec.path):
                side.forward(model, session.port.inputs, session.device)
        finally:
            recorder.remove()
        calls.append(recorder.calls)
    modules, fused = {}, {}
    for pair in align(calls[0], calls[1], session.port.plan):
        if pair.part is None:
            modules[pair.torch] = pair.paddle
        elif isinstance(pair.part, Slice):
            fused.setdefault(pair.paddle, []).append((pair.torch, pair.part))
    modules.setdefault("", "")
    return LayerPairs(modules, {path: tuple(group) for path, group in fused.items()})
