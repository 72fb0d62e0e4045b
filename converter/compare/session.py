"""Both models, built from a spec, with weights, device and precision set up."""

from __future__ import annotations

import contextlib
import threading
import dataclasses
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError
from ..lazy import import_paddle, import_torch
from .port import FORCED_PASS
from ..results import Skipped
from . import precision as prec
from . import restore
from .weights import check_loaded
from .capture import module_path
from .model_errors import forward_errors, spec_call_errors


@dataclass
class Options:
    device: str = "auto"
    precision: str = "as-is"  # or "strict"
    emulate: dict = field(default_factory=dict)  # side -> tf32 | bf16 | fp16
    strategy: str = "auto"  # full | binary | auto
    # one thread for everything: no torch work beside the paddle passes, no analysis threads
    # (the same report, slower; for debugging the speed machinery). T2P_SERIAL=1 sets it.
    serial: bool = field(default_factory=lambda: os.environ.get("T2P_SERIAL", "") == "1")
    max_memory: int | None = None  # the most the process may hold, in bytes (--max-memory); None: what is available
    train: bool = False  # the training checks run on the session too: they hold both models, never streamed


_FLOAT64_RUNS = {"running": 0, "before": None, "lock": threading.Lock()}


@contextlib.contextmanager
def _float64_by_default():
    """Torch's default dtype float64 while the float64 reference runs, so that what a forward makes
    in the default dtype is float64 too: HF OPT (transformers 4.44) fills its causal mask with
    torch.full(..., torch.finfo(float64).min), which overflows a float32 tensor. The float64 runs
    are the only torch work then (on the worker thread, one on each thread at most); the setting
    is global: the first run to start sets it, the last to end puts back what was before."""
    import torch
    runs = _FLOAT64_RUNS
    with runs["lock"]:
        if runs["running"] == 0:
            runs["before"] = torch.get_default_dtype()
            torch.set_default_dtype(torch.float64)
        runs["running"] += 1
    try:
        yield
    finally:
        with runs["lock"]:
            runs["running"] -= 1
            if runs["running"] == 0:
                torch.set_default_dtype(runs["before"])


def _keys_off(missing, unexpected) -> str:
    """The first few keys a model lacks and has too many of, for a one-line message."""
    return f"(missing: {', '.join(missing[:5]) or 'none'}; unexpected: {', '.join(unexpected[:5]) or 'none'})"


def _in_float64(inputs):
    """The spec's inputs (a tuple or a dict of arrays) with their floating arrays in float64."""
    widen = lambda a: a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a
    return {k: widen(v) for k, v in inputs.items()} if isinstance(inputs, dict) else tuple(widen(v) for v in inputs)


def pick_device(requested: str) -> str:
    torch = import_torch()
    paddle = import_paddle()
    gpu_torch = torch.cuda.is_available()
    gpu_paddle = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if requested == "auto":
        return "cuda" if gpu_torch and gpu_paddle else "cpu"
    if requested == "cuda" and not (gpu_torch and gpu_paddle):
        raise UserError(f"--device cuda: no GPU visible to {'paddle' if gpu_torch else 'torch'}; "
                        "use --device cpu, or install the CUDA builds of both frameworks")
    return requested


class PortSession:
    """Both models set up for a run. `restore()` (or leaving a `with` block) puts back every framework
    flag, hook, train/eval mode, device and in-place weight change the session made; a set-up that
    fails puts them back itself. The paddle model keeps the weights it is verified with."""

    def __init__(self, spec, options: Options, weights: str | None = None, converted: str | None = None,
                 mapping: str | None = None):
        self.spec = spec
        self.options = options
        self.undo = restore.Undo()
        self.skipped: list[Skipped] = []  # measurements not taken, and why: counted in the report's notes
        try:
            self._set_up(spec, options, weights, converted, mapping)
        except BaseException:
            self.restore()
            raise

    def restore(self) -> None:
        self.undo.close()

    def skip(self, what: str, exc: BaseException) -> None:
        """Keeps, for the report's notes, a measurement not taken (`what`: it and what stands in for
        it) and the exception that stopped it."""
        self.skipped.append(Skipped.of(what, exc))

    def __enter__(self) -> PortSession:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def _set_up(self, spec, options: Options, weights: str | None, converted: str | None, mapping: str | None):
        from ..frameworks import paddle_side
        self.undo.push(restore.record_torch_flags())
        self.undo.push(restore.record_paddle_flags())
        self.device = pick_device(options.device)
        paddle = import_paddle()
        paddle.set_device("gpu" if self.device == "cuda" else "cpu")
        from ..spec import LOADED
        from .build import on_meta_device, plan_build
        self.loaded = mapping == LOADED or (not mapping and spec.loaded)
        # streamed where the in-memory run would not fit, decided from the checkpoint before any model is built
        self.build = plan_build(weights, converted, self.loaded, options.max_memory, options.train)
        with spec_call_errors(spec.path, "torch_model"), self.build.torch():
            self.torch_model = spec.torch_model()  # on the meta device: its buffers computed on the CPU
        self.undo.push(restore.record_layers(list(self.torch_model.modules())))
        self.streams: dict = {}  # side -> its weights streamed block by block (compare/stream.py)
        self.checkpoint = None
        if on_meta_device(self.torch_model):
            if options.train:
                raise UserError(f"verify-port --train: torch_model() from '{spec.path}' is built on the meta device (its "
                                "weights streamed block by block), and the training checks hold both models: build it "
                                "with its weights, or run without --train")
            self._stream_torch(weights)
        else:
            self.undo.push(restore.record_torch_device(self.torch_model))
            if weights:
                self.undo.push(restore.record_torch_weights(self.torch_model))
                self._load_torch_weights(weights)
        with spec_call_errors(spec.path, "paddle_model"), self.build.paddle():
            self.paddle_model = spec.paddle_model()
        self.undo.push(restore.record_layers([layer for _, layer in paddle_side.named_layers(self.paddle_model)]))
        self._set_weights(spec, converted, mapping)
        self.torch_model.eval()
        self.paddle_model.eval()
        from .replay import float64_kernels
        from .widen import Float64Reference
        read = self.checkpoint.tensor if self.checkpoint is not None else None  # streamed: from the checkpoint
        self.reference64 = Float64Reference(self.torch_model, read=read)  # widened block by block as it runs
        self.torch64 = float64_kernels(self.reference64.model)
        if self.device == "cuda":
            self.torch_model.cuda()
        if options.precision == "strict":
            prec.set_strict()
        self.precision = {"torch": prec.torch_precision(self.device), "paddle": prec.paddle_precision(self.device)}
        if options.precision == "strict":
            for side in self.precision.values():
                side.matmul = "fp32"
        for side, fmt in options.emulate.items():
            self.precision[side].emulated = fmt
        self._emulation: list = []  # what undoes the forward check's emulation while it is on
        self.undo.push(self._emulation_off)
        self._emulation_on()
        with spec_call_errors(spec.path, "inputs"):
            self.inputs = spec.inputs()
        check_arrays(self.inputs, f"spec '{spec.path}': inputs()")
        if not self.streams:  # tensors that count on one side only, where both models are whole in memory
            from .onesided import state_findings
            self.plan.notes.extend(state_findings(self.plan, self.torch_model, self.paddle_model, self.inputs, self.device))
        self.returned: dict[str, str] = {}  # side -> what its forward returned (see returned())

    def _emulation_on(self) -> None:
        """The forward check's emulation of --emulate: every forward of the torch model under
        torch_rounding, paddle's operators rounding their inputs (see precision)."""
        emulate = self.options.emulate
        if "torch" in emulate:
            handles = prec.emulate_torch(self.torch_model, emulate["torch"])
            self._emulation.append(lambda: [h.remove() for h in handles])
        if "paddle" in emulate:
            self._emulation.append(prec.emulate_paddle(emulate["paddle"]))

    def _emulation_off(self) -> None:
        while self._emulation:
            self._emulation.pop()()

    @contextlib.contextmanager
    def training(self):
        """The session as the training checks use it: they train copies of the models under the
        straight-through form of --emulate's rounding (precision.emulate_torch_training and
        emulate_paddle_training), so the forward check's emulation is off inside, and on again after."""
        self._emulation_off()
        try:
            yield self
        finally:
            self._emulation_on()

    def _set_weights(self, spec, converted: str | None, mapping: str | None) -> None:
        """The paddle model's weights: torch's converted in memory, the file `converted`, or (mapping
        'loaded') those it was loaded with, checked bit for bit against torch's under the rules
        (self.weight_check). Its own buffers that no torch tensor fills stay as it built them."""
        from ..inmemory import convert_in_memory, plan_for_loaded
        from ..spec import LOADED
        rules = spec.mapping if mapping == LOADED else mapping or spec.mapping
        self.weight_check = None
        if self.streams:
            self._stream_paddle(rules, converted)
            return
        if self.loaded:
            self.plan, _, self.torch_state = plan_for_loaded(self.torch_model, self.paddle_model, rules)
            state = None
        else:
            state, self.plan, _, self.torch_state = convert_in_memory(
                self.torch_model, self.paddle_model, rules)
        check_dtypes(self.plan, self.paddle_model)
        if converted:
            from ..frameworks.paddle_side import load_into
            missing, unexpected = load_into(self.paddle_model, converted)
            if missing or unexpected:
                raise UserError(f"--converted '{converted}' does not fit the paddle model "
                                f"{_keys_off(missing, unexpected)}; convert it again for this model")
        elif state is not None:
            own = self.paddle_model.state_dict()  # its buffers given back as they are: paddle warns of each one left out
            self.paddle_model.set_state_dict(state | {k: v for k, v in own.items() if k not in state})
        if self.loaded:
            self.weight_check = check_loaded(self.plan, self.torch_state, self.paddle_model)

    @property
    def formats(self) -> dict:
        return {side: p.format for side, p in self.precision.items()}

    def _stream_torch(self, weights: str | None) -> None:
        """A torch model on the meta device: its weights streamed from the checkpoint block by block."""
        from .stream import Checkpoint, stream_torch
        if not weights:
            raise UserError(f"torch_model() from '{self.spec.path}' is built on the meta device (no weights): give its "
                            "checkpoint with --weights, whose weights are then streamed block by block")
        self.checkpoint = Checkpoint(weights, self.torch_model)
        self.undo.push(self.checkpoint.close)
        self.streams["torch"] = stream_torch(self.torch_model, self.checkpoint)
        self.undo.push(self.streams["torch"].close)

    def _stream_paddle(self, rules, converted: str | None) -> None:
        """The paddle model's weights beside the streamed torch model (see stream.paddle_weights)."""
        from .stream import paddle_weights
        weights = paddle_weights(self.torch_model, self.paddle_model, rules, self.checkpoint, converted, self.loaded)
        self.undo.push(weights.close)
        self.plan, self.torch_state = weights.plan, self.checkpoint
        check_dtypes(self.plan, self.paddle_model)
        self.weight_check = weights.weight_check
        self.paddle_from_plan = weights.from_plan
        if weights.streamed is not None:
            self.streams["paddle"] = weights.streamed
        self.plan.notes.extend([weights.note] + [self.build.note] * bool(self.build.note))

    def _load_torch_weights(self, path: str) -> None:
        from ..io import open_source
        from ..io.torch_io import numpy_to_tensor
        with open_source(path) as source:
            state = {name: numpy_to_tensor(source.read(name), info.dtype) for name, info in source.infos.items()}
        try:
            result = self.torch_model.load_state_dict(state, strict=False)
        except RuntimeError as exc:
            raise UserError(f"--weights '{path}' does not fit torch_model(): {str(exc).splitlines()[-1].strip()}") from None
        if result.missing_keys or result.unexpected_keys:
            raise UserError(f"--weights '{path}' does not fit torch_model() "
                            f"{_keys_off(result.missing_keys, result.unexpected_keys)}")

    # running -------------------------------------------------------------------------
    def run_torch(self):
        from ..frameworks import torch_side
        with forward_errors("torch_model()", self.spec.path):
            out = torch_side.forward(self.torch_model, self.inputs, self.device)
        self.returned.setdefault("torch", returned(out, torch_side))
        return out

    def run_paddle(self, forced: bool = False):
        """The paddle model on the inputs; `forced`: in the pass whose hooks hand its layers torch's
        inputs, where an error may be the forcing's rather than the model's, and is said so."""
        from ..frameworks import paddle_side
        which, hint = ("paddle_model() with torch's inputs handed to its layers", "this is a limit of teacher "
                       "forcing for this model: run with --strategy binary, and report it") if forced \
            else ("paddle_model()", "fix the model or the inputs")
        running = FORCED_PASS.set(forced)
        try:
            with forward_errors(which, self.spec.path, hint, ours=not forced):  # forcing's own errors: said so
                out = paddle_side.forward(self.paddle_model, self.inputs, self.device)
        finally:
            FORCED_PASS.reset(running)
        self.returned.setdefault("paddle", returned(out, paddle_side))
        return out

    def paddle64_outputs(self, paths) -> dict[str, list] | None:
        """Per paddle path, the outputs there of a float64 copy of the paddle model, free-running on
        the same inputs (casts to float32 kept in float64, to a narrower format rounding as in the
        model, whose rounding is then no drift of its kernels): against the paddle model's own,
        its fp32 drift, which its kernels make larger where they sum less exactly than torch's
        (paddle's CPU mean over 4096 values is eight times further from float64 than torch's). The
        copy is made once, on first use (see _paddle_model64); None where it cannot be made or does not
        run in float64. It runs with nothing beside it (a probe, the final outputs' judgement), on
        as many threads as torch uses."""
        from ..frameworks import paddle_side
        from .capture import capture_calls
        from .forced import _paddle_keeps_float64
        from .replay import to_numpy_list
        if not hasattr(self, "_paddle64"):
            try:
                self._paddle64 = self._paddle_model64()
            except Exception as exc:  # noqa: BLE001 - a model that cannot be made in float64: said in the notes
                self.skip("paddle's own drift, on a float64 copy of the paddle model (torch's stands in)", exc)
                self._paddle64 = None
        if self._paddle64 is None:
            return None
        wide = _in_float64(self.inputs)
        from ..tree import flatten
        returned = {}  # what the model returns, from its first run

        def forward():
            with _paddle_keeps_float64(("float32",)), paddle_side.cpu_threads(import_torch().get_num_threads()):
                out = paddle_side.forward(self._paddle64, wide, self.device)
            returned.setdefault("first", out)
            return to_numpy_list(flatten(out, paddle_side.is_float_tensor), "paddle")
        try:  # a cast to float32 computes in float64 here; one to a narrower format rounds as in the model
            drawn = paddle_side.random_state(self.device)
            calls = capture_calls(paddle_side, self._paddle64, forward, set(paths)).calls
            out = {path: to_numpy_list(calls[path].outputs, "paddle") for path in paths}
            first = to_numpy_list(flatten(returned.pop("first"), paddle_side.is_float_tensor), "paddle")
            # uncaptured: only what the model returns is held twice
            again = forward() if paddle_side.may_differ_again(drawn, self.device) else None
        except Exception as exc:  # noqa: BLE001 - a model that does not run in float64: said in the notes
            self.skip("paddle's own drift, on a float64 copy of the paddle model (torch's stands in)", exc)
            return None
        if any(a.dtype != np.float64 for outputs in out.values() for a in outputs):
            return None  # it computed in float32 inside
        if again is not None and not repeated(first, again):  # a budget re-measured on it would hold the randomness
            self._note_random()
            return None
        return out

    def _note_random(self) -> None:
        """Said once in the report's notes: the float64 copy of the paddle model gave other outputs
        on a second run of the same inputs, so paddle's own drift was not measured on it."""
        if getattr(self, "_said_random", False):
            return
        self._said_random = True
        self.plan.notes.append("the paddle model is not deterministic in eval: a float64 copy of it gave other "
                               "outputs on a second run of the same inputs (dropout active or a random op "
                               "in eval: paddle.nn.functional.dropout defaults to training=True); paddle's own drift "
                               "was not measured, the budget is torch's")

    def _paddle_model64(self):
        """A float64 copy of the paddle model with its weights: a deep copy cast to float64, or, where
        its weights are streamed from the plan, paddle_model() built again in float64 and streamed the
        same way; None where they are read from a file (a copy from the plan would not hold them)."""
        from ..tree import model_copy
        if "paddle" not in self.streams:
            model = model_copy(self.paddle_model)
            model.to(dtype="float64")
            return model
        if not self.paddle_from_plan:
            return None
        from .stream import stream_paddle
        with self.build.paddle():  # as the paddle model was built
            model = self.spec.another_paddle_model()
        streamed = stream_paddle(model, self.plan, self.checkpoint, dtype="float64")
        self.undo.push(streamed.close)
        return model.eval()

    def run_torch64(self, fmt: str | None = None, draw: int = 0):
        """The float64 reference model on the inputs (matmul inputs rounded to `fmt` if given; see
        precision.torch_rounding for `draw`)."""
        from ..frameworks import torch_side
        from .replay import float64_reference
        x = _in_float64(self.inputs)
        with forward_errors("torch_model() in float64", self.spec.path,
                             "verify-port calibrates every budget against a float64 run of the torch model: make its "
                             "forward work in float64 (masks from torch.finfo(x.dtype), no float32 constants forced)"), \
                float64_reference(fmt, draw), _float64_by_default():
            return torch_side.forward(self.torch64, x, "cpu")

    def torch_module(self, path: str):
        """The torch module at `path` (or the module of the call key `path`, capture.call_key); where the
        weights are streamed, with its block's weights made."""
        module = self.torch_model.get_submodule(module_path(path))
        if "torch" in self.streams:
            self.streams["torch"].enter_module(module)
        return module

    def torch64_module(self, path: str):
        return self.torch64.get_submodule(module_path(path))

    def paddle_layer(self, path: str):
        from .paddle_own import _layer_at
        layer = _layer_at(self.paddle_model, module_path(path))
        if "paddle" in self.streams:
            self.streams["paddle"].enter_module(layer)
        return layer


# bad inputs and models found before anything runs ----------------------------------------------

def check_arrays(value, what: str) -> None:
    """Arrays verify-port can run both models on and compare: numeric (no objects or strings),
    no empty dimension (nothing to compare), floating values finite (a NaN or Inf in the inputs
    makes every comparison meaningless). `value`: an array, or a dict or tuple of them."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, tuple) \
        else [(None, value)]
    for key, a in items:
        if not isinstance(a, np.ndarray):
            continue  # the caller's contract check says what it must be
        name = what if key is None else f"{what}[{key!r}]"
        if a.dtype.kind not in "biufc":
            raise UserError(f"{name} is an array of {a.dtype} ({a.dtype.kind!r} kind): the models take numeric "
                            "arrays; give numbers (floats, integer ids, booleans)")
        if 0 in a.shape:
            raise UserError(f"{name} has shape {list(a.shape)}: an empty batch leaves nothing to compare; give "
                            "at least one element along every axis")
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            where = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
            raise UserError(f"{name} holds {a[where]} at {list(where)}: a NaN or Inf in the inputs makes every "
                            "comparison meaningless; give finite values (within float32's range, 3.4e38)")


def check_dtypes(plan, paddle_model) -> None:
    """The torch weights, as the mapping gives them, in the paddle model's dtypes: a float64 (or
    bf16) torch model against a float32 paddle one is not the port to verify (paddle would refuse
    the weights, or cast them and verify another model than torch's)."""
    from ..frameworks.paddle_side import state_dict_infos
    want = state_dict_infos(paddle_model)
    for entry in plan.entries:
        target = want.get(entry.name)
        if target is not None and entry.dtype != target.dtype:
            source = "+".join(part.source for part in entry.parts)
            raise UserError(f"the models' dtypes differ: torch_model()'s {source} is {entry.dtype}, paddle_model()'s "
                            f"{entry.name} is {target.dtype}; verify-port compares two models of one dtype: build both "
                            f"in {target.dtype} (torch: model.to(torch.{target.dtype})) or both in {entry.dtype} "
                            "(paddle: model.to(dtype=...)); --emulate checks a bf16 or fp16 deployment")


def returned(value, side, depth: int = 0) -> str:
    """What a forward returned, as the structure verify-port compares: floating tensors as
    'tensor', other tensors by dtype, dicts by their keys (with their types: 0 and '0' differ)
    in order, lists and tuples alike by position (one of one element as that element), anything
    else by its type."""
    if depth > 20:
        return "..."
    inner = lambda v: returned(v, side, depth + 1)
    if side.is_float_tensor(value):
        return "tensor"
    if side.is_tensor(value):
        return f"{str(value.dtype).rpartition('.')[2]} tensor"
    if hasattr(value, "to_tuple"):  # an HF or PaddleNLP ModelOutput: its fields that are set, by position (a
        return inner(value.to_tuple())  # port returning the tuple that return_dict=False gives is the same)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {inner(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):  # one tensor alone or in a tuple of one: the same
        return inner(value[0]) if len(value) == 1 else "(" + ", ".join(inner(v) for v in value) + ")"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__ + "(" + ", ".join(f"{f.name}={inner(getattr(value, f.name))}"
                                                      for f in dataclasses.fields(value)) + ")"
    return "None" if value is None else f"a {type(value).__name__}"


# two runs of one float64 model on the same inputs that differ by more than this, relative to the
# largest value, draw something at random (a dropout's mask); a kernel that sums in another order
# from one run to the next (atomics on a GPU) moves a float64 result by about 1e-16 of it
REPEAT_TOLERANCE = 1e-9


def repeated(one: list, other: list) -> bool:
    """Whether two runs' outputs (lists of arrays) are the same run's, up to REPEAT_TOLERANCE."""
    if len(one) != len(other):
        return False
    for a, b in zip(one, other):
        if a.shape != b.shape:
            return False
        if not np.issubdtype(a.dtype, np.floating):
            if not np.array_equal(a, b):
                return False
            continue
        if np.array_equal(a, b, equal_nan=True):
            continue
        scale = float(np.nanmax(np.abs(np.where(np.isfinite(a), a, 0)))) if a.size else 0.0
        if not np.all(np.isclose(a, b, rtol=0, atol=REPEAT_TOLERANCE * max(scale, np.finfo(np.float64).tiny),
                                 equal_nan=True)):
            return False
    return True
