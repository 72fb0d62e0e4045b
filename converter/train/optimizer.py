"""Torch optimizers, schedulers and gradient clipping translated to paddle's.

A translation is data, a `Recipe` (a paddle callable's dotted name and its arguments, which may
be recipes themselves): the same recipe builds the paddle objects and prints them as paddle code
(`--emit-optimizer`), so what is checked and what is printed cannot differ."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import UserError

PARAMETERS = "model.parameters()"  # the argument every paddle optimizer takes its parameters by


@dataclass
class Recipe:
    """A paddle call: `path(**kwargs)`; arguments that are recipes are built first."""

    path: str
    kwargs: dict = field(default_factory=dict)

    def build(self, parameters):
        import paddle
        target = paddle
        for part in self.path.split(".")[1:]:
            target = getattr(target, part)
        return target(**{k: _built(v, parameters) for k, v in self.kwargs.items()})

    def code(self) -> str:
        return f"{self.path}({', '.join(f'{k}={_code(v)}' for k, v in self.kwargs.items())})"


class _Parameters:
    """Placeholder for the model's parameters inside a recipe: all of them, or those named (the
    paddle counterparts of what torch's optimizer holds, where it holds only some)."""

    def __init__(self, names: tuple | None = None):
        self.names = names

    def __repr__(self):
        if self.names is None:
            return PARAMETERS
        return "[p for n, p in model.named_parameters() if n in names]"

    def literal(self) -> str:
        """The names as a set literal, sorted (the same text on every run)."""
        return "{" + ", ".join(repr(n) for n in self.names) + "}"

    def of(self, model) -> list:
        if self.names is None:
            return model.parameters()
        return [p for n, p in model.named_parameters() if n in set(self.names)]


PARAMS = _Parameters()


def _built(value, parameters):
    if isinstance(value, Recipe):
        return value.build(parameters)
    return parameters if isinstance(value, _Parameters) else value


def _code(value) -> str:
    if isinstance(value, Recipe):
        return value.code()
    if isinstance(value, float):
        return repr(float(value))
    return repr(value)


@dataclass(frozen=True)
class Translation:
    """Paddle's optimizer (and scheduler, clipping) for a torch optimizer, as recipes."""

    optimizer: Recipe
    scheduler: Recipe | None = None
    notes: list = field(default_factory=list)
    parameters: _Parameters = PARAMS  # what it optimizes: all the model's parameters, or those named
    taken_as: str | None = None  # said of a subclass of a torch optimizer, translated as that optimizer

    def build(self, model):
        """(optimizer, scheduler) for the paddle model; the scheduler is the optimizer's lr."""
        scheduler = self.scheduler.build(None) if self.scheduler is not None else None
        return self._over_parameters(scheduler).build(self.parameters.of(model)), scheduler

    def _over_parameters(self, learning_rate) -> Recipe:
        """The optimizer's recipe over the parameters it optimizes, with `learning_rate` (the scheduler,
        built or as code) where there is a scheduler."""
        kwargs = dict(self.optimizer.kwargs, parameters=self.parameters)
        if self.scheduler is not None:
            kwargs["learning_rate"] = learning_rate
        return Recipe(self.optimizer.path, kwargs)

    def only(self, names) -> Translation:
        """This translation optimizing only the paddle parameters named (torch's optimizer holds only
        their counterparts)."""
        return replace(self, parameters=_Parameters(tuple(sorted(names))), notes=[
            *self.notes, "torch's optimizer holds only some of the model's trainable parameters: paddle's holds "
            "their counterparts"])

    def describe(self) -> str:
        text = self._over_parameters(self.scheduler).code()
        if self.parameters.names is not None:
            text += f" with names = {self.parameters.literal()}"
        return text if self.taken_as is None else f"{text} ({self.taken_as})"

    def code(self) -> str:
        """A spec's `paddle_optimizer(model)` that builds the same objects."""
        lines = ["import paddle", "", "", "def paddle_optimizer(model):"]
        notes = self.notes if self.taken_as is None else [self.taken_as, *self.notes]
        if notes:
            lines[1:1] = [f"# {note}" for note in notes]
        if self.parameters.names is not None:
            lines.append(f"    names = {self.parameters.literal()}")
        if self.scheduler is not None:
            lines.append(f"    scheduler = {self.scheduler.code()}")
        lines.append(f"    optimizer = {self._over_parameters(_Name('scheduler')).code()}")
        lines.append("    return optimizer, scheduler" if self.scheduler is not None else "    return optimizer")
        return "\n".join(lines) + "\n"


class _Name:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


# optimizers -------------------------------------------------------------------------------
# what a parameter group holds besides its hyperparameters: how torch computes, and what schedulers add
NOT_SETTINGS = {"params", "param_names", "foreach", "fused", "capturable", "differentiable", "initial_lr", "max_lr",
                "min_lr", "base_momentum", "max_momentum"}


def _one_group(opt) -> dict:
    groups = opt.param_groups
    first = groups[0]
    for g in groups[1:]:
        differ = sorted(k for k in set(g) | set(first) if k not in NOT_SETTINGS and _differs(g.get(k), first.get(k)))
        if differ:
            raise UserError(f"torch_optimizer() has {len(groups)} parameter groups that differ in {', '.join(differ)}: "
                            "give paddle_optimizer(model) in the spec, with paddle's parameter groups "
                            "(parameters=[{'params': ..., 'learning_rate': a factor of the optimizer's rate, "
                            "'weight_decay': ...}, ...])")
    if any(g.get("maximize") for g in groups):
        raise UserError("torch_optimizer() maximizes: paddle's optimizers have no counterpart; "
                        "give paddle_optimizer(model) in the spec")
    return first


def _differs(a, b) -> bool:
    return bool(a != b) if not isinstance(a, (tuple, list)) else len(a) != len(b) or any(map(_differs, a, b))


def _decay(group, kwargs, name="weight_decay"):
    if group.get("weight_decay"):
        kwargs[name] = float(group["weight_decay"])


def _sgd(group):
    kwargs = {"learning_rate": float(group["lr"])}
    if group.get("dampening"):
        raise UserError(f"torch SGD has dampening={group['dampening']}: paddle's Momentum has none; "
                        "give paddle_optimizer(model) in the spec")
    if not group.get("momentum"):
        _decay(group, kwargs)
        return Recipe("paddle.optimizer.SGD", kwargs)
    kwargs["momentum"] = float(group["momentum"])
    kwargs["use_nesterov"] = bool(group.get("nesterov"))
    _decay(group, kwargs)
    return Recipe("paddle.optimizer.Momentum", kwargs)


def _adam(group, path):
    kwargs = {"learning_rate": float(group["lr"]), "beta1": float(group["betas"][0]),
              "beta2": float(group["betas"][1]), "epsilon": float(group["eps"])}
    if group.get("decoupled_weight_decay"):  # torch's Adam(decoupled_weight_decay=True) is AdamW
        path = "paddle.optimizer.AdamW"
    if path.endswith("AdamW"):
        kwargs["weight_decay"] = float(group.get("weight_decay") or 0.0)
    else:
        _decay(group, kwargs)
    if group.get("amsgrad"):
        kwargs["amsgrad"] = True
    return Recipe(path, kwargs)


def _rmsprop(group):
    kwargs = {"learning_rate": float(group["lr"]), "rho": float(group["alpha"]), "epsilon": float(group["eps"]),
              "momentum": float(group.get("momentum") or 0.0), "centered": bool(group.get("centered"))}
    _decay(group, kwargs)
    return Recipe("paddle.optimizer.RMSProp", kwargs)


def _adagrad(group):
    if group.get("lr_decay"):
        raise UserError(f"torch Adagrad has lr_decay={group['lr_decay']}: paddle's Adagrad has none; "
                        "give paddle_optimizer(model) in the spec")
    kwargs = {"learning_rate": float(group["lr"]), "epsilon": float(group["eps"]),
              "initial_accumulator_value": float(group.get("initial_accumulator_value") or 0.0)}
    _decay(group, kwargs)
    return Recipe("paddle.optimizer.Adagrad", kwargs)


def _adamax(group):
    kwargs = {"learning_rate": float(group["lr"]), "beta1": float(group["betas"][0]),
              "beta2": float(group["betas"][1]), "epsilon": float(group["eps"])}
    _decay(group, kwargs)  # torch's Adamax adds its weight decay to the gradient (L2), as paddle's float does
    return Recipe("paddle.optimizer.Adamax", kwargs)


OPTIMIZERS = {
    "SGD": _sgd,
    "Adam": lambda g: _adam(g, "paddle.optimizer.Adam"),
    "AdamW": lambda g: _adam(g, "paddle.optimizer.AdamW"),
    "RMSprop": _rmsprop,
    "Adagrad": _adagrad,
    "Adamax": _adamax,
}

NOTES = {
    "RMSprop": "paddle's RMSProp adds epsilon inside the square root, torch's outside it",
    "Adam": "paddle keeps beta1 and beta2 in float32",
    "AdamW": "paddle keeps beta1 and beta2 in float32",
}


# schedulers -------------------------------------------------------------------------------
def _base_lr(sched) -> float:
    return float(sched.optimizer.param_groups[0]["initial_lr"])


# torch scheduler -> (paddle's in paddle.optimizer.lr, {its argument: (torch's attribute, as converted)}), each
# besides the learning rate
PLAIN_SCHEDULERS = {
    "StepLR": ("StepDecay", {"step_size": ("step_size", int), "gamma": ("gamma", float)}),
    "MultiStepLR": ("MultiStepDecay", {"milestones": ("milestones", sorted), "gamma": ("gamma", float)}),
    "ExponentialLR": ("ExponentialDecay", {"gamma": ("gamma", float)}),
    "CosineAnnealingLR": ("CosineAnnealingDecay", {"T_max": ("T_max", int), "eta_min": ("eta_min", float)}),
    "LinearLR": ("LinearLR", {"total_steps": ("total_iters", int), "start_factor": ("start_factor", float),
                              "end_factor": ("end_factor", float)}),
}


def _plain(s, lr):
    name, arguments = PLAIN_SCHEDULERS[type(s).__name__]
    return Recipe(f"paddle.optimizer.lr.{name}", {"learning_rate": lr, **{
        argument: convert(getattr(s, attr)) for argument, (attr, convert) in arguments.items()}})


def _one_cycle(s, lr):
    group = s.optimizer.param_groups[0]
    first_phase_end = s._schedule_phases[0]["end_step"]
    return Recipe("paddle.optimizer.lr.OneCycleLR", {
        "max_learning_rate": float(group["max_lr"]), "total_steps": int(s.total_steps),
        "divide_factor": float(group["max_lr"] / group["initial_lr"]), "end_learning_rate": float(group["min_lr"]),
        "phase_pct": float((first_phase_end + 1) / s.total_steps),
        "anneal_strategy": "cos" if s._anneal_func_type == "cos" else "linear",
        "three_phase": len(s._schedule_phases) == 3})


def _sequential(s, lr):
    """A warmup chain: LinearLR for the first milestone steps, then another schedule."""
    inner, milestones = s._schedulers, list(s._milestones)
    warm = inner[0] if inner else None
    if (len(inner) != 2 or type(warm).__name__ != "LinearLR" or milestones != [warm.total_iters]
            or warm.end_factor != 1.0):
        raise UserError("torch SequentialLR translates only as a warmup chain: [LinearLR(total_iters=W, "
                        "end_factor=1.0), another schedule] with milestones=[W]; give paddle_optimizer(model)")
    after = translate_scheduler(inner[1], lr)
    return Recipe("paddle.optimizer.lr.LinearWarmup", {"learning_rate": after, "warmup_steps": int(warm.total_iters),
                                                      "start_lr": lr * float(warm.start_factor), "end_lr": lr})


SCHEDULERS = {**dict.fromkeys(PLAIN_SCHEDULERS, _plain), "OneCycleLR": _one_cycle, "SequentialLR": _sequential}


def translate_scheduler(sched, lr: float | None = None) -> Recipe:
    name = type(sched).__name__
    if name not in SCHEDULERS:
        raise UserError(f"torch scheduler {name} has no translation here (known: {', '.join(SCHEDULERS)}); "
                        "give paddle_optimizer(model) in the spec, returning (optimizer, scheduler)")
    return SCHEDULERS[name](sched, _base_lr(sched) if lr is None else lr)


def torch_class(opt) -> type:
    """The nearest class of `opt` that torch.optim exports by its name: its own for torch's
    optimizers, torch's base class for a subclass (an Adam whose step clips first), torch's
    Optimizer where no other is a base."""
    import torch
    return next(c for c in type(opt).__mro__ if getattr(torch.optim, c.__name__, None) is c)


def subclass_note(opt) -> str | None:
    """What is said of a torch optimizer whose class torch.optim does not export: it is taken as its
    nearest torch class, without what its own code adds. None for torch's own optimizers."""
    base = torch_class(opt)
    if base is type(opt):
        return None
    return (f"torch's {type(opt).__name__} is taken as its nearest torch class, torch.optim.{base.__name__}: what "
            f"its own code adds to {base.__name__}'s (clipping in its step, another update) is left out")


def translate(opt, sched=None, clip_norm: float | None = None) -> Translation:
    """Paddle's equivalent of a torch optimizer (and its scheduler and global-norm clipping); a
    subclass of one of torch's optimizers is translated as that optimizer, with a note."""
    name = torch_class(opt).__name__
    if name not in OPTIMIZERS:
        own = "" if name == type(opt).__name__ else f" (the nearest torch class of {type(opt).__name__})"
        raise UserError(f"torch optimizer {name}{own} has no translation here (known: {', '.join(OPTIMIZERS)}); "
                        "give paddle_optimizer(model) in the spec")
    recipe = OPTIMIZERS[name](_one_group(opt))
    notes = [NOTES[name]] if name in NOTES else []
    if clip_norm is not None:
        recipe.kwargs["grad_clip"] = Recipe("paddle.nn.ClipGradByGlobalNorm", {"clip_norm": float(clip_norm)})
        notes.append("paddle's ClipGradByGlobalNorm divides by the norm, torch's clip_grad_norm_ by norm + 1e-6")
    scheduler = translate_scheduler(sched) if sched is not None else None
    taken_as = subclass_note(opt)
    if taken_as is not None:
        taken_as += "; give paddle_optimizer(model) where that changes the update"
    return Translation(recipe, scheduler, notes, taken_as=taken_as)
