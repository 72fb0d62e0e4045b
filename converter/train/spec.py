"""The port spec's optional training functions, read from a PortSpec with their defaults.

    batches()                    -> [(inputs, target), ...]   default: [(inputs(), None)] repeated
    torch_loss(output, target)   -> scalar tensor              default: a fixed random projection
    paddle_loss(output, target)  -> scalar tensor              default: the same projection
    torch_optimizer(model)       -> optimizer or (optimizer, scheduler)   default: SGD(lr=0.01)
    paddle_optimizer(model)      -> the same for paddle        default: translated from torch's
    clip_grad_norm               a number: torch clips by global norm (clip_grad_norm_) before
                                 each step; paddle's translated optimizer gets ClipGradByGlobalNorm

`inputs` of a batch is what `inputs()` returns; `target` a numpy array, dict or tuple of them (or
None), handed to the loss as tensors of the loss's framework."""

from __future__ import annotations


import numpy as np

from ..errors import UserError
from ..spec import TRAINING, call_spec_function
from ..compare.model_errors import spec_call_errors
from ..compare.session import check_arrays

DEFAULT_LR = 0.01
PROJECTION_SEED = 1234


class TrainSpec:
    """A PortSpec's training side."""

    def __init__(self, spec):
        self.spec = spec
        self.path = spec.path
        self.has = {name: _given(spec, name) for name in TRAINING}
        _check_pairs(self.path, self.has)
        clip = spec.training_part("clip_grad_norm")
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0):
            raise UserError(f"spec '{self.path}': clip_grad_norm must be a positive number (the max global norm); "
                            f"got {clip!r}")
        self.clip_grad_norm = float(clip) if clip is not None else None
        self._projections: dict = {}
        self._count = 0  # how many batches batches() gave

    def call(self, name: str, *args):
        """The spec's function `name` on args; what it raises is bad input naming its line."""
        with spec_call_errors(self.path, name):
            return call_spec_function(self.path, self.spec.module, name, *args)

    def loss(self, name: str, output, target):
        """The spec's loss `name` on (output, target); without batches() the target is None, which a
        loss that fails on it is told."""
        try:
            return self.call(name, output, target)
        except UserError as exc:
            if target is not None or self.has["batches"]:
                raise
            raise UserError(f"{exc.message}; the target is None: the spec has no batches(), so every step "
                            "trains on inputs() alone; define batches() returning (inputs, target) pairs") from None

    # batches ---------------------------------------------------------------------------------
    def batches(self, steps: int) -> list:
        if not self.has["batches"]:
            inputs = self.spec.inputs()
            return [(inputs, None)] * steps
        given = self.spec.training_part("batches")
        got = given if isinstance(given, (list, tuple)) else self.call("batches")
        if not isinstance(got, (list, tuple)) or not got:
            raise UserError(f"spec '{self.path}': batches() must return a non-empty list of (inputs, target) pairs")
        out = []
        for i, item in enumerate(got):
            if not isinstance(item, tuple) or len(item) != 2:
                raise UserError(f"spec '{self.path}': batches()[{i}] must be a pair (inputs, target)")
            inputs, target = item
            _check_arrays(inputs, f"spec '{self.path}': batches()[{i}] inputs", allow_none=False)
            _check_arrays(target, f"spec '{self.path}': batches()[{i}] target", allow_none=True)
            out.append((inputs, target))
        self._count = len(out)
        return [out[k % len(out)] for k in range(steps)]

    def batch_name(self, k: int) -> str:
        """Where step k's batch comes from, as the spec gives it."""
        if not self.has["batches"]:
            return "inputs()"
        return f"batches()[{k % self._count}]" if self._count else "batches()"

    # losses ----------------------------------------------------------------------------------
    def projection(self, shapes: tuple) -> list:
        """The default loss's fixed random weights, one array per output tensor."""
        if shapes not in self._projections:
            rng = np.random.default_rng(PROJECTION_SEED)
            self._projections[shapes] = [rng.standard_normal(s) / np.sqrt(max(int(np.prod(s)), 1)) for s in shapes]
        return self._projections[shapes]

    # optimizers ------------------------------------------------------------------------------
    def _optimizer(self, name: str, model, optimizer_type, framework: str) -> tuple:
        """(optimizer, scheduler or None) the spec's `name` returns for `model`."""
        got = self.call(name, model)
        opt, sched = got if isinstance(got, tuple) and len(got) == 2 else (got, None)
        if not isinstance(opt, optimizer_type):
            raise UserError(f"spec '{self.path}': {name}(model) must return a {framework} optimizer or "
                            f"(optimizer, scheduler); got {type(opt).__name__}")
        return opt, sched

    def torch_optimizer(self, model):
        """(optimizer, scheduler or None) for a torch model."""
        import torch
        if not self.has["torch_optimizer"]:
            return torch.optim.SGD(model.parameters(), lr=DEFAULT_LR), None
        opt, sched = self._optimizer("torch_optimizer", model, torch.optim.Optimizer, "torch")
        _check_scheduler(self.path, "torch_optimizer", sched, torch.optim.lr_scheduler.LRScheduler,
                         torch.optim.lr_scheduler.ReduceLROnPlateau)
        _check_held(self.path, "torch_optimizer", [p for g in opt.param_groups for p in g["params"]],
                    model.parameters())
        return opt, sched

    def paddle_optimizer(self, model):
        """(optimizer, scheduler or None) for the paddle model, when the spec gives it; else None."""
        if not self.has["paddle_optimizer"]:
            return None
        import paddle
        opt, sched = self._optimizer("paddle_optimizer", model, paddle.optimizer.Optimizer, "paddle")
        if sched is None and isinstance(getattr(opt, "_learning_rate", None), paddle.optimizer.lr.LRScheduler):
            sched = opt._learning_rate
        _check_scheduler(self.path, "paddle_optimizer", sched, paddle.optimizer.lr.LRScheduler,
                         paddle.optimizer.lr.ReduceOnPlateau)
        _check_held(self.path, "paddle_optimizer", paddle_held(opt), model.parameters())
        return opt, sched


def paddle_held(opt) -> list:
    """The tensors a paddle optimizer holds, those of each of its parameter groups in turn."""
    held = getattr(opt, "_parameter_list", None) or []
    return [q for p in held for q in (p.get("params", []) if isinstance(p, dict) else [p])]


def _check_arrays(value, what: str, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    items = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else [value]
    if not all(isinstance(v, np.ndarray) for v in items):
        raise UserError(f"{what} must be a numpy array, or a dict or tuple of them")
    check_arrays(value, what)


def _check_held(path: str, name: str, held: list, parameters) -> None:
    """Every tensor an optimizer holds is one of the model's parameters: one that is not is never
    trained by the model's backward, and its state has no counterpart on the other side."""
    own = {id(p) for p in parameters}
    for i, tensor in enumerate(held):
        if id(tensor) not in own:
            shape = list(getattr(tensor, "shape", []))
            raise UserError(f"spec '{path}': {name}(model) holds a tensor that is not one of the model's parameters "
                            f"(item {i} of those it holds, shape {shape}); give the optimizer the parameters of the model it "
                            "is handed (model.parameters(), or a part of them)")


def _given(spec, name: str) -> bool:
    """Whether the spec gives training part `name`; one it gives as something unusable is bad input."""
    value = spec.training_part(name)
    if value is None:
        return False
    if callable(value) or (name == "batches" and isinstance(value, (list, tuple))):
        return True
    raise UserError(f"spec '{spec.path}': {name} must be {TRAINING[name]}, not {type(value).__name__}")


def _check_pairs(path: str, has: dict) -> None:
    """Parts that only make sense together: a loss on one side only would be compared with the
    default projection on the other, a paddle optimizer alone with torch's default SGD."""
    if has["torch_loss"] != has["paddle_loss"]:
        given, missing = ("torch_loss", "paddle_loss") if has["torch_loss"] else ("paddle_loss", "torch_loss")
        raise UserError(f"spec '{path}' defines {given} but not {missing}: give both (the port's loss is "
                        "checked against torch's), or neither for the default loss (a fixed random projection "
                        "of the outputs)")
    if has["paddle_optimizer"] and not has["torch_optimizer"]:
        raise UserError(f"spec '{path}' defines paddle_optimizer but not torch_optimizer: torch would train with "
                        f"the default SGD(lr={DEFAULT_LR}); give torch_optimizer(model) too")


def _check_scheduler(path: str, name: str, sched, base, on_metric) -> None:
    """A scheduler --train can step: one of the framework's schedulers, stepped once per step
    without a metric."""
    if sched is None:
        return
    if isinstance(sched, on_metric):
        raise UserError(f"spec '{path}': {name}(model) returns {type(sched).__name__}, which steps on a metric "
                        "that --train does not have; return a schedule by step, or the optimizer alone")
    if not isinstance(sched, base):
        raise UserError(f"spec '{path}': {name}(model) must return an optimizer or (optimizer, scheduler), the "
                        f"scheduler one of {base.__module__}'s; got {type(sched).__name__} as the scheduler")
