"""What the forward check's stages read from a set-up port: the models, the mapping plan, the
formats, the float64 reference and the streamed weights, declared once. compare/session.py's
PortSession is the implementation (the training checks hand theirs as TrainSession.port); the
functions of compare/ and verify/ take a `session: Session`. Importing this module imports
nothing else of the package, so that any module may annotate with it."""

from __future__ import annotations

import contextvars
from typing import Any, Protocol

# whether the paddle pass running on this thread is a forced one (Session.run_paddle(forced=True)):
# the hooks that serve both passes of a chunk (compare/known.py) read it; each thread has its own
FORCED_PASS = contextvars.ContextVar("forced_paddle_pass", default=False)


class Session(Protocol):
    options: Any  # compare.session.Options
    device: str  # "cpu" or "cuda"
    spec: Any  # the PortSpec
    inputs: Any  # the spec's inputs: numpy arrays, a tuple or a dict of them
    torch_model: Any
    paddle_model: Any
    torch64: Any  # the float64 reference's model with float64 kernels (replay.float64_kernels)
    reference64: Any  # its Float64Reference, widened block by block as it runs (widen.py)
    plan: Any  # the mapping plan from torch's state to paddle's (rules.plan)
    torch_state: Any  # torch's tensors by name, read as the plan reads them
    streams: dict  # side -> its weights streamed block by block (stream.py); empty in memory
    checkpoint: Any  # the checkpoint streamed from, or None
    precision: dict  # side -> what it computes in (precision.py)
    weight_check: Any  # with mapping 'loaded': the loaded weights against torch's, else None
    returned: dict  # side -> what its forward returned, in words
    skipped: list  # results.Skipped: the measurements not taken, counted in the report's notes

    @property
    def formats(self) -> dict:
        """side -> the format its matmuls compute in (fp32, tf32, bf16, fp16)."""

    @property
    def training(self) -> Any:
        """A context in which both models are in training mode."""

    def skip(self, what: str, exc: BaseException) -> None: ...

    def run_torch(self) -> Any: ...

    def run_paddle(self, forced: bool = False) -> Any: ...

    def run_torch64(self, fmt: str | None = None, draw: int = 0) -> Any: ...

    def paddle64_outputs(self, paths) -> dict | None: ...

    def torch_module(self, path: str) -> Any: ...

    def torch64_module(self, path: str) -> Any: ...

    def paddle_layer(self, path: str) -> Any: ...
