"""The port spec: a Python file shared by convert-weights and verify-port.

It defines torch_model() -> torch.nn.Module, paddle_model() -> paddle.nn.Layer
and inputs() -> dict of numpy arrays (keyword arguments) or a tuple (positional).
It may set `mapping` to a rule-set name, a rule-file path, None to infer, or "loaded" (verify
the weights the paddle model was loaded with instead of converting torch's), and define the
training parts verify-port --train uses (batches, torch_loss, paddle_loss, torch_optimizer,
paddle_optimizer, clip_grad_norm; see converter/train/spec.py).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import traceback
import types
from typing import TYPE_CHECKING, Any, Callable, Union

from .errors import UserError

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only
    import paddle
    import torch

    from .frameworks import Inputs

# each part of a spec: a function that builds it, or (models, inputs) the thing itself
TorchModel = Union[Callable[[], "torch.nn.Module"], "torch.nn.Module"]
PaddleModel = Union[Callable[[], "paddle.nn.Layer"], "paddle.nn.Layer"]
InputsOrBuilder = Union[Callable[[], "Inputs"], "Inputs"]

REQUIRED = ("torch_model", "paddle_model", "inputs")
LOADED = "loaded"  # the mapping value under which the paddle model keeps the weights it was loaded with
# the optional training parts, and what each is when given
TRAINING = {"batches": "a function returning a list of (inputs, target), or that list",
            "torch_loss": "a function (output, target) -> scalar tensor",
            "paddle_loss": "a function (output, target) -> scalar tensor",
            "torch_optimizer": "a function (model) -> optimizer or (optimizer, scheduler)",
            "paddle_optimizer": "a function (model) -> optimizer or (optimizer, scheduler)"}
DEFAULT_STEPS = 10  # the training steps verify-port --train runs unless told


class PortSpec:
    """The three callables of a port (and optionally its mapping and training parts), from a spec
    file (`PortSpec.from_file(path)`) or given in Python:

        PortSpec(torch_model=build_torch, paddle_model=build_paddle, inputs=make_inputs, mapping=None,
                 batches=make_batches, torch_loss=..., paddle_loss=..., torch_optimizer=...,
                 paddle_optimizer=..., clip_grad_norm=None)

    Each model callable returns the model; a model object itself is taken too. `inputs` is a
    callable returning the inputs, or the inputs themselves (`batches` likewise). The training
    parts are optional (see verify-port --train in README.md). Models are built once, on first use."""

    def __init__(self, torch_model: TorchModel, paddle_model: PaddleModel, inputs: InputsOrBuilder,
                 mapping: str | None = None, *, batches: Any = None, torch_loss: Callable | None = None,
                 paddle_loss: Callable | None = None, torch_optimizer: Callable | None = None,
                 paddle_optimizer: Callable | None = None, clip_grad_norm: float | None = None,
                 label: str = "<in-memory spec>"):
        self.path = label
        self.module = types.SimpleNamespace(torch_model=_as_builder(torch_model, "torch_model", label),
                                            paddle_model=_as_builder(paddle_model, "paddle_model", label),
                                            inputs=_as_builder(inputs, "inputs", label), mapping=mapping)
        given = {"batches": batches, "torch_loss": torch_loss, "paddle_loss": paddle_loss,
                 "torch_optimizer": torch_optimizer, "paddle_optimizer": paddle_optimizer}
        for name, value in given.items():
            if value is not None:
                setattr(self.module, name, _as_builder(value, name, label))
        if clip_grad_norm is not None:
            self.module.clip_grad_norm = clip_grad_norm  # checked where training reads it
        self._torch = None
        self._paddle = None

    @classmethod
    def from_file(cls, path: str) -> PortSpec:
        """The spec a Python file defines (see the port spec contract in README.md)."""
        return load_spec(path)

    @classmethod
    def _of_module(cls, path: str, module: Any) -> PortSpec:
        spec = cls.__new__(cls)
        spec.path, spec.module, spec._torch, spec._paddle = path, module, None, None
        return spec

    @property
    def mapping(self):
        """The rule set the spec names (None: inferred): a shipped set's name or a rule file's path,
        or the rules themselves as a dict (a rule file's JSON object), read here; None too when it
        says "loaded"."""
        value = getattr(self.module, "mapping", None)
        from .rules.ruleset import RuleSet, parse_ruleset
        if self.loaded or value is None or isinstance(value, (str, RuleSet)):
            return None if self.loaded else value
        if isinstance(value, dict):
            return parse_ruleset(value, f"spec '{self.path}': mapping")
        raise UserError(f"spec '{self.path}': mapping is a {type(value).__name__}; give a shipped rule set's name, a "
                        "rule file's path, the rules as a dict ({'rules': [...]}), \"loaded\", or None to infer them")

    @property
    def loaded(self) -> bool:
        """mapping = "loaded": verify-port leaves the paddle model's own weights in place and checks
        them bit for bit against torch's under the rules (inferred, or the shipped set that fits)."""
        return getattr(self.module, "mapping", None) == LOADED

    def training_part(self, name: str) -> Any:
        """The spec's training part `name` (one of TRAINING, or clip_grad_norm), or None."""
        return getattr(self.module, name, None)

    def _call(self, name: str):
        return call_spec_function(self.path, self.module, name)

    def torch_model(self) -> torch.nn.Module:
        if self._torch is None:
            from .lazy import import_torch
            self._torch = self._model("torch_model", import_torch().nn.Module, "torch.nn.Module")
        return self._torch

    def paddle_model(self) -> paddle.nn.Layer:
        if self._paddle is None:
            from .lazy import import_paddle
            self._paddle = self._model("paddle_model", import_paddle().nn.Layer, "paddle.nn.Layer")
        return self._paddle

    def _model(self, name: str, kind: type, kind_name: str):
        model = self._call(name)
        if not isinstance(model, kind):
            raise UserError(f"spec '{self.path}': {name}() returned {type(model).__name__}, not a {kind_name}")
        return model

    def another_paddle_model(self) -> paddle.nn.Layer:
        """A second paddle model, built as paddle_model() builds the first (not the one it keeps)."""
        from .lazy import import_paddle
        model = self._call("paddle_model")
        if not isinstance(model, import_paddle().nn.Layer) or model is self._paddle:
            raise UserError(f"spec '{self.path}': paddle_model() gave no new paddle.nn.Layer when called again")
        return model

    def inputs(self) -> Inputs:
        import numpy as np
        value = self._call("inputs")
        items = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else None
        if items is None or not all(isinstance(v, np.ndarray) for v in items):
            raise UserError(f"spec '{self.path}': inputs() must return a dict or a tuple of numpy arrays")
        return value


def _built(value: Any) -> bool:
    """A torch module or paddle layer already built (both are callable: calling one would run it)."""
    torch, paddle = sys.modules.get("torch"), sys.modules.get("paddle")
    return ((torch is not None and isinstance(value, torch.nn.Module))
            or (paddle is not None and isinstance(value, paddle.nn.Layer)))


_AS_IS = {"inputs": (dict, tuple), "batches": (list, tuple)}  # the parts that may be given as the value itself
_WANTED = {"torch_model": "a function returning the model", "paddle_model": "a function returning the model",
           "inputs": "a function returning the inputs", **TRAINING}


def _as_builder(value: Any, name: str, label: str) -> Callable[[], Any]:
    """A spec part as a function: a built model (not a training part: a loss may be a module) or a
    value _AS_IS takes is returned by one; anything else must be callable."""
    if isinstance(value, _AS_IS.get(name, ())) or (name not in TRAINING and _built(value)):
        return lambda: value
    if not callable(value):
        raise UserError(f"spec '{label}': {name} must be {_WANTED[name]}, not {type(value).__name__}")
    return value


def spec_from_functions(torch_model: TorchModel, paddle_model: PaddleModel, inputs: InputsOrBuilder,
                        mapping: str | None = None, label: str = "<in-memory spec>") -> PortSpec:
    """A spec built in Python rather than read from a file, with the same contract."""
    return PortSpec(torch_model, paddle_model, inputs, mapping, label=label)


def call_spec_function(path: str, module, name: str, *args):
    """The spec's function `name` on args; what it raises, or an exit, is bad input: one line
    naming the spec's line (else the innermost frame)."""
    try:
        return getattr(module, name)(*args)
    except UserError:
        raise
    except SystemExit as exc:
        raise UserError(f"spec '{path}': {name}() called sys.exit({exc.code!r}){spec_line(exc, path)}; "
                        "a spec must return its value, not exit") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # an Exception, or what is none: asyncio.CancelledError, a class of the spec's own
        raise UserError(f"spec '{path}': {name}() failed with {failure(exc, path)}") from None


def spec_line(exc: BaseException, path: str) -> str:
    """' (line N)' of the last frame of `exc`'s traceback in the spec file, or ''."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == os.path.abspath(path)]
    return f" (line {frames[-1].lineno})" if frames else ""


def failure(exc: BaseException, path: str) -> str:
    """One line for an exception raised while running a spec's code: its type, its message
    (200 characters at most) and where: the spec's line, else the file and line that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = spec_line(exc, path) or (f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else "")
    return f"{said(exc)}{where}"


def said(exc: BaseException) -> str:
    """An exception's type and its message on one line (200 characters at most), the type alone
    where it has no message."""
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _SpecLoader(importlib.machinery.SourceFileLoader):
    """A spec is Python whatever its suffix (spec.txt, a file with none; spec_from_file_location
    finds no loader for those), compiled from its source each time: no bytecode is read from or
    written beside it (spec.txt and spec.py would share one cache name)."""

    def get_code(self, fullname):
        return self.source_to_code(self.get_data(self.path), self.path)


def load_spec(path: str) -> PortSpec:
    if not os.path.isfile(path):
        raise UserError(f"spec file '{path}' does not exist")
    from .lazy import import_paddle, import_torch
    import_torch()
    import_paddle()  # imported quietly before the spec imports it
    name = "port_spec_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    module_spec = importlib.util.spec_from_loader(name, _SpecLoader(name, path))
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise UserError(f"spec '{path}' line {exc.lineno}: syntax error: {exc.msg}") from None
    except SystemExit as exc:
        raise UserError(f"spec '{path}' called sys.exit({exc.code!r}) while it was imported{spec_line(exc, path)}; "
                        "a spec must only define its functions") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # an Exception, or what is none: asyncio.CancelledError, a class of the spec's own
        frames = traceback.extract_tb(exc.__traceback__)
        line = f" (line {frames[-1].lineno})" if frames else ""
        raise UserError(f"spec '{path}' failed to import: {said(exc)}{line}") from None
    missing = [f for f in REQUIRED if not callable(getattr(module, f, None))]
    if missing:
        raise UserError(f"spec '{path}' does not define {', '.join(f + '()' for f in missing)}; "
                        "see the port spec contract in README.md")
    return PortSpec._of_module(path, module)
