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

DEFAULT_LR = 0.01
PROJECTION_SEED = 1234


class TrainSpec:
    """A PortSpec's training side."""

    def __init__(self, spec):
        self.spec = spec
        self.path = spec.path
        self.has = {name: callable(spec.training_part(name)) for name in TRAINING}
        clip = spec.training_part("clip_grad_norm")
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0):
            raise UserError(f"spec '{self.path}': clip_grad_norm must be a positive number (the max global norm); "
                            f"got {clip!r}")
        self.clip_grad_norm = float(clip) if clip is not None else None
        self._projections: dict = {}

    def call(self, name: str, *args):
        """The spec's function `name` on args; what it raises is bad input naming its line."""
        return call_spec_function(self.path, self.spec.module, name, *args)

    # batches ---------------------------------------------------------------------------------
    def batches(self, steps: int) -> list:
        if not self.has["batches"]:
            inputs = self.spec.inputs()
            return [(inputs, None)] * steps
        got = self.call("batches")
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
        return [out[k % len(out)] for k in range(steps)]

    # losses ----------------------------------------------------------------------------------
    def projection(self, shapes: tuple) -> list:
        """The default loss's fixed random weights, one array per output tensor."""
        if shapes not in self._projections:
            rng = np.random.default_rng(PROJECTION_SEED)
            self._projections[shapes] = [rng.standard_normal(s) / np.sqrt(max(int(np.prod(s)), 1)) for s in shapes]
        return self._projections[shapes]

    # optimizers ------------------------------------------------------------------------------
    def torch_optimizer(self, model):
        """(optimizer, scheduler or None) for a torch model."""
        import torch
        if not self.has["torch_optimizer"]:
            return torch.optim.SGD(model.parameters(), lr=DEFAULT_LR), None
        got = self.call("torch_optimizer", model)
        opt, sched = got if isinstance(got, tuple) and len(got) == 2 else (got, None)
        if not isinstance(opt, torch.optim.Optimizer):
            raise UserError(f"spec '{self.path}': torch_optimizer(model) must return a torch optimizer or "
                            f"(optimizer, scheduler); got {type(opt).__name__}")
        return opt, sched

    def paddle_optimizer(self, model):
        """(optimizer, scheduler or None) for the paddle model, when the spec gives it; else None."""
        if not self.has["paddle_optimizer"]:
            return None
        import paddle
        got = self.call("paddle_optimizer", model)
        opt, sched = got if isinstance(got, tuple) and len(got) == 2 else (got, None)
        if not isinstance(opt, paddle.optimizer.Optimizer):
            raise UserError(f"spec '{self.path}': paddle_optimizer(model) must return a paddle optimizer or "
                            f"(optimizer, scheduler); got {type(opt).__name__}")
        if sched is None and isinstance(getattr(opt, "_learning_rate", None), paddle.optimizer.lr.LRScheduler):
            sched = opt._learning_rate
        return opt, sched


def _check_arrays(value, what: str, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    items = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else [value]
    if not all(isinstance(v, np.ndarray) for v in items):
        raise UserError(f"{what} must be a numpy array, or a dict or tuple of them")
