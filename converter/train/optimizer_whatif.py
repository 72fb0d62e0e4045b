"""Optimizer what-ifs over the settings the two optimizers keep: torch's teacher-forced step re-run
in float64 with one setting of its parameter group changed, the values tried read from the optimizers
themselves (verify/counterfactual.candidates): each value paddle's optimizer and its parameter group
keep, the opposite flag, the complement `1 - x` of a fraction; a tuple (betas) one element at a time.
A change whose step lands on paddle's within the budget is a cause, confirmed by re-running."""

from __future__ import annotations

import inspect
import itertools
import time
from dataclasses import dataclass

import numpy as np

from ..diagnosis import confirmed_cause, went
from .optimizer import NOT_SETTINGS

MAX_RUNS = 40  # re-runs of one teacher-forced step: each is a float64 step of the whole model
MAX_SECONDS = 20.0


@dataclass(frozen=True)
class Hit:
    key: str
    was: object
    to: object
    ratio: float
    paddle_name: str | None  # the setting of paddle's optimizer that keeps the value tried, if one does


def _plain(value) -> bool:
    if isinstance(value, (bool, int, float)):
        return True
    return isinstance(value, tuple) and 0 < len(value) <= 4 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)


def paddle_values(popt) -> dict:
    """The plain values paddle's optimizer keeps (on itself and in its parameter groups), by name."""
    out = {k: v for k, v in vars(popt).items() if _plain(v)}
    for group in getattr(popt, "_param_groups", None) or []:
        if isinstance(group, dict):
            out.update({k: v for k, v in group.items() if k != "params" and _plain(v)})
    return out


def changes(group: dict, theirs: dict) -> list:
    """(key, torch's value, the value tried) for every setting of torch's parameter `group`."""
    from ..verify.counterfactual import candidates
    suggested = list(theirs.values())
    out = []
    for key, value in group.items():
        if key in NOT_SETTINGS or key == "lr" or not _plain(value):
            continue
        if isinstance(value, tuple):
            for i, element in enumerate(value):
                out += [(key, value, value[:i] + (c,) + value[i + 1:]) for c in candidates(element, suggested)]
        else:
            out += [(key, value, c) for c in candidates(value, suggested)]
    return out


def teacher_forced(check, pair, fb, cls, lr: float, kwargs: dict, clip) -> float | None:
    """Torch's teacher-forced step in float64 from the failing step's start: `cls(lr=lr, **kwargs)` as
    one group over the parameters in the order of torch's state (its indices), torch's state loaded,
    the gradients clipped as `clip` says (clip_gradients); its ratio against paddle's result for
    `pair`, or None where torch's optimizer refuses the settings."""
    import torch

    from .judge import judge
    from .optimizer_check import own_state, set_to_start
    failed = check.failed
    before, index = failed["before"], failed["index"]
    params = set_to_start(check.ref, before)
    try:
        opt = cls([params[n] for n in index], lr=lr, **kwargs)
        opt.load_state_dict({"state": own_state(before["state"], torch.float64)["state"],
                             "param_groups": [dict(opt.state_dict()["param_groups"][0])]})
        clip_gradients(check.ref, clip)
        opt.step()
    except (ValueError, KeyError, TypeError, RuntimeError):  # a setting torch's optimizer refuses is no cause
        return None
    want = pair.to_paddle({t: params[t].detach().numpy() for t in pair.torch})
    got = failed["paddle"][pair.paddle]
    return judge("optimizer", fb.step, fb.torch, fb.paddle, want, got, np.zeros_like(want),
                 float(np.max(np.abs(want), initial=0)) * 1e-6).ratio


def search(check, pair, group: dict, cls, fb) -> list:
    """The confirmed changes of torch's settings (see the module's docstring), best first: each
    re-run (teacher_forced) under `cls` with torch's parameter group as it was, one setting changed."""
    theirs = paddle_values(check.opt)
    accepted = inspect.signature(cls.__init__).parameters
    norm = check.tspec.clip_grad_norm
    clip = ("ClipGradByGlobalNorm", norm) if norm else None
    hits, until = [], time.monotonic() + MAX_SECONDS
    for key, was, to in itertools.islice(changes(group, theirs), MAX_RUNS):
        if time.monotonic() > until:
            break
        kwargs = {k: v for k, v in dict(group, **{key: to}).items() if k in accepted and k not in ("params", "lr", "self")}
        ratio = teacher_forced(check, pair, fb, cls, group["lr"], kwargs, clip)
        if ratio is not None and ratio <= 1:
            hits.append(Hit(key, was, to, ratio, _named(key, to, was, theirs)))
    return sorted(hits, key=lambda h: h.ratio)


def _named(key: str, to, was, theirs: dict) -> str | None:
    """The setting of paddle's optimizer that keeps the value tried: the one of the same name holding
    it (paddle's `_amsgrad`, torch's `amsgrad`); else, for a number, the one holding that number."""
    value = _changed(was, to)[1]
    same = [k for k, v in theirs.items() if type(v) is type(value) and v == value]
    by_name = [k for k in same if k.lstrip("_").lower() == key.lower()]
    if by_name or isinstance(value, bool):
        return by_name[0] if by_name else None
    return same[0] if same else None


def said(hit: Hit, cls_name: str, before: float, popt) -> tuple[str, str]:
    """(cause, hint) for a confirmed change (`popt`: paddle's optimizer, whose constructor the hint names)."""
    kept = f" (paddle's optimizer keeps {hit.paddle_name}={_changed(hit.was, hit.to)[1]!r})" if hit.paddle_name else ""
    cause = confirmed_cause(f"torch's {cls_name} has {hit.key}={hit.was!r}", "its teacher-forced step re-run",
                            f"{hit.key}={hit.to!r}{kept}", "gives paddle's step", went(before, hit.ratio))
    hint = f"give paddle's optimizer the setting that matches torch's {hit.key}={hit.was!r}"
    parameter = hit.paddle_name.lstrip("_") if hit.paddle_name else None
    if parameter and parameter in inspect.signature(type(popt).__init__).parameters:
        hint = (f"construct paddle's {type(popt).__name__} with {parameter}={_changed(hit.was, hit.to)[0]!r}, "
                f"as torch's {hit.key}")
    return cause, hint


def _changed(was, to) -> tuple:
    """(was, to) where a setting is a number or flag; for a tuple (betas, one element tried at a time),
    their elements at the one place they differ."""
    if not isinstance(was, tuple):
        return was, to
    return next((a, b) for a, b in zip(was, to) if a != b)


def clip_gradients(model, clip) -> None:
    """Torch's gradients of `model` clipped as paddle's `clip` (kind, value) clips them; None: not at all."""
    import torch
    if clip is None:
        return
    kind, value = clip
    if kind == "ClipGradByGlobalNorm":
        torch.nn.utils.clip_grad_norm_(model.parameters(), value)
    elif kind == "ClipGradByNorm":
        for p in model.parameters():
            if p.grad is not None:
                torch.nn.utils.clip_grad_norm_([p], value)
    elif kind == "ClipGradByValue":
        torch.nn.utils.clip_grad_value_(model.parameters(), value)
