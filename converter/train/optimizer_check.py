"""The optimizer, teacher-forced: at every step torch's parameters, gradients and optimizer state
are loaded into paddle's optimizer, which takes one step; its new parameters and state are
compared with torch's, against a budget from the same torch step in float64 plus the conventions
that differ and are not bugs (paddle's float32 betas, clipping's + 1e-6, RMSProp's epsilon)."""

from __future__ import annotations

import copy

import numpy as np

from ..compare.precision import U32
from ..layout import contiguous
from .judge import judge
from .loop import paddle_optimizer
from .session import TrainSession, one_thread

CLIP_EPS = 1e-6
FORCED_FIRST = 3


def _betas(popt):
    return float(getattr(popt, "_beta1", 0.9)), float(getattr(popt, "_beta2", 0.999))


def _pow32(beta: float, n: int) -> np.ndarray:
    acc = np.float32(beta)
    for _ in range(n - 1):
        acc = np.float32(acc * np.float32(beta))
    return np.array([acc], dtype=np.float32)


def _state_table(popt, torch_state: dict, lr: float) -> dict:
    """Paddle accumulator name -> the array torch's state gives it (torch's layout), for one torch parameter."""
    kind = type(popt).__name__
    get = lambda key: torch_state[key].detach().cpu().numpy() if key in torch_state else None
    step = int(torch_state.get("step", 0))
    if kind in ("Adam", "AdamW"):
        b1, b2 = _betas(popt)
        out = {"moment1": get("exp_avg"), "moment2": get("exp_avg_sq"), "moment2_max": get("max_exp_avg_sq")}
        out["beta1_pow_acc"], out["beta2_pow_acc"] = _pow32(b1, step + 1), _pow32(b2, step + 1)
        return out
    if kind == "Momentum":
        return {"velocity": get("momentum_buffer")}
    if kind == "RMSProp":
        buf = get("momentum_buffer")
        return {"mean_square": get("square_avg"), "momentum": None if buf is None else buf * lr,
                "mean_grad": get("grad_avg")}
    if kind == "Adagrad":
        return {"moment": get("sum")}
    if kind == "Adamax":
        return {"moment": get("exp_avg"), "inf_norm": get("exp_inf"),
                "beta1_pow_acc": _pow32(_betas(popt)[0], step + 1)}
    return {}


# paddle accumulator name -> the key of torch's state it holds; STATE_OF_KIND where a kind names its state otherwise
TORCH_STATE_OF = {"moment1": "exp_avg", "moment2": "exp_avg_sq", "velocity": "momentum_buffer",
                  "mean_square": "square_avg", "moment": "sum", "mean_grad": "grad_avg"}
STATE_OF_KIND = {"Adamax": {"moment": "exp_avg", "inf_norm": "exp_inf"}}


class OptimizerCheck:
    """Teacher-forces paddle's optimizer on torch's steps (called from torch's fp32 run)."""

    def __init__(self, session: TrainSession, tspec, steps: int):
        self.session, self.tspec, self.steps = session, tspec, steps
        self.model = session.paddle_copy()
        self.opt, self.sched = paddle_optimizer(session, tspec, self.model)
        self.params = dict(self.model.named_parameters())
        # paddle name -> its pair, every trainable paddle parameter: a torch tensor split in pieces gives
        # several, a paddle tensor fused from several torch tensors (q|k|v) one, laid out as the plan says
        self.by_paddle = {pair.paddle: pair for pair in session.pairs
                          if pair.paddle in self.params and not self.params[pair.paddle].stop_gradient}
        # the float64 reference (a torch copy and the spec's optimizer on it), made at the first checked
        # step: by then the per-layer backward has given its float64 copy back for it
        self.ref, self.ref_opt = None, None
        self.rows: list = []
        self.failed = None  # what the first step over budget started from, for the what-ifs
        self.drift: dict = {}  # paddle name -> the conventions' accumulated effect on the weights
        self.loss_drift: list = []  # per step: that drift's first-order effect on the loss
        self.rule_gap = 0.0  # the largest relative change of a step paddle's own update rule makes (Adamax's epsilon)
        self._prime()

    def _prime(self):
        """Paddle creates its accumulators on the first step: take one on zero gradients (every
        value it touches is overwritten before each checked step)."""
        import paddle
        for pair in self.by_paddle.values():
            p = self.params[pair.paddle]
            p.grad = paddle.zeros(p.shape, dtype=p.dtype)
        self.opt.step()
        self.opt.clear_grad()

    def _set(self, pair, array: np.ndarray, grad: np.ndarray):
        import paddle
        p = self.params[pair.paddle]
        p.set_value(contiguous(np.asarray(array, dtype=np.float32)))
        grad = contiguous(np.asarray(grad, dtype=np.float32))
        held = p.grad  # the gradient paddle's clear_grad zeroed: written in place where it fits
        if held is not None and tuple(held.shape) == grad.shape and held.dtype == paddle.float32:
            held.set_value(grad)
        else:
            p.grad = paddle.to_tensor(grad)

    def checks(self, k: int) -> bool:
        """Whether step k is teacher-forced: the first steps (fresh and filled state) and the last;
        the learning rate of every step is compared on its own."""
        return k < FORCED_FIRST or k == self.steps - 1

    def __call__(self, k: int, opt, model, before: dict):
        import torch
        with one_thread():  # its torch work: conversions and the float64 reference step
            self._step(k, opt, model, before)
        if k == self.steps - 1 and self.failed is None:  # no what-if steps its models again: the next
            self.session.done_with(self.model, "paddle")  # copies asked for are these
            if self.ref is not None:
                self.session.done_with(self.ref, "torch", torch.float64)

    def _step(self, k: int, opt, model, before: dict):
        params = {n: t.cpu().numpy() for n, t in before["params"].items()}
        grads = {n: t.cpu().numpy() for n, t in before["grads"].items()}
        checked = self.checks(k)
        stepped = self._stepped(grads)
        # the gradients in paddle's layout, where this step uses them
        laid_out = {pair.paddle: pair.to_paddle(grads) for pair in stepped if checked or pair.paddle in self.drift}
        # each element's drift moves the loss by g * drift, with signs we do not know: combined as
        # independent terms
        self.loss_drift.append(float(np.sqrt(sum(_squared(laid_out[pair.paddle] * self.drift[pair.paddle])
                                                 for pair in stepped if pair.paddle in self.drift))))
        if not checked:
            self._drift_only(model, opt, params, grads)
            if self.sched is not None:
                self.sched.step()
            return
        torch_names = {id(p): n for n, p in model.named_parameters()}
        index = [torch_names[id(p)] for g in opt.param_groups for p in g["params"]]
        state_before = {index[i]: s for i, s in before["state"]["state"].items()}
        lr = float(opt.param_groups[0]["lr"])
        for pair in stepped:
            self._set(pair, pair.to_paddle(params), laid_out[pair.paddle])
            self._load_state(pair, state_before, params, lr)
        self._force_lr(float(before["state"]["param_groups"][0]["lr"]))  # the rate of this step (torch's
        self.opt.step()  # scheduler has stepped since)
        self.opt.clear_grad()
        if self.sched is not None:
            self.sched.step()
        ref_params, ref_state = self._reference(before, index)
        start = len(self.rows)
        self._compare(k, model, opt, params, ref_params, ref_state, grads, state_before)
        if self.failed is None and any(r.bad for r in self.rows[start:]):
            self.failed = {"step": k, "before": before, "index": index,
                           "paddle": {pair.paddle: self.params[pair.paddle].numpy() for pair in self.by_paddle.values()}}

    def _stepped(self, grads: dict) -> list:
        """The pairs whose torch tensors all have a gradient at this step."""
        return [pair for pair in self.by_paddle.values() if all(t in grads for t in pair.torch)]

    def _force_lr(self, lr: float):
        """Paddle's base learning rate set to torch's for this step (its schedule is the lr phase's
        to judge, not this one's); per-parameter factors and groups stay paddle's own."""
        if self.sched is not None:
            self.sched.last_lr = lr
        else:
            self.opt.set_lr(lr)

    def _load_state(self, pair, state_before: dict, params: dict, lr: float):
        """Torch's optimizer state of the torch tensors `pair` is made of, in paddle's layout, loaded
        into paddle's accumulators; a state torch does not hold for one tensor is zero there."""
        pname = self.params[pair.paddle].name
        tables = {t: _state_table(self.opt, state_before.get(t, {}), lr) for t in pair.torch}
        for acc in tables[pair.torch[0]]:
            holder = self.opt._accumulators.get(acc, {}).get(pname)
            if holder is None:
                continue
            values = {t: tables[t][acc] for t in pair.torch}
            if acc.endswith("_pow_acc"):  # a scalar kept per parameter: one step count for all its parts
                value = values[pair.torch[0]]
            elif all(v is None for v in values.values()):
                value = np.zeros(holder.shape, dtype=np.float32)
            else:  # laid out as the parameter
                value = pair.to_paddle({t: np.zeros_like(params[t]) if v is None else v for t, v in values.items()})
            holder.set_value(contiguous(np.asarray(value, dtype=np.float32)))

    def _reference(self, before: dict, index: list):
        """Torch's step again in float64 from the same parameters, gradients and state."""
        import torch
        if self.ref is None:
            self.ref = self.session.torch_copy(torch.float64)
            self.ref_opt, _ = self.tspec.torch_optimizer(self.ref)
        ref_params = set_to_start(self.ref, before)
        load_own_state(self.ref_opt, before["state"], torch.float64)
        if self.tspec.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.ref.parameters(), self.tspec.clip_grad_norm)
        self.ref_opt.step()
        state = {index[i]: s for i, s in self.ref_opt.state_dict()["state"].items()}
        return {n: p.detach().numpy() for n, p in ref_params.items()}, state

    def _conventions(self, grads: dict) -> float:
        """Relative differences paddle's optimizer has by design (see DESIGN: Training conventions)."""
        rel = 0.0
        kind = type(self.opt).__name__
        if kind in ("Adam", "AdamW", "Adamax"):  # their betas taken as float32 by paddle's kernels
            b1, b2 = _betas(self.opt)
            # Adamax's norm takes beta2 u, no (1 - beta2) term: beta2's rounding moves it by U32 relative
            b2_rel = U32 if kind == "Adamax" else U32 * b2 / (1 - b2)
            rel += (U32 * b1 / (1 - b1)) ** 2 + b2_rel ** 2
        if self.tspec.clip_grad_norm is not None:
            norm = float(np.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values())))
            if norm > self.tspec.clip_grad_norm:
                # torch divides by norm + 1e-6; each side sums the squares of every gradient in its own order
                count = sum(g.size for g in grads.values())
                rel += (CLIP_EPS / norm) ** 2 + (U32 * np.sqrt(count)) ** 2
        return float(np.sqrt(rel))

    def _drift_only(self, model, opt, params_before: dict, grads: dict):
        """What the conventions add to the weights on a step that is not teacher-forced."""
        conv = self._conventions(grads)
        torch_params, torch_state = _torch_side(model, opt)
        for pair in self._stepped(grads):
            self._moved(pair, opt, torch_state, conv, torch_params, params_before)

    def _moved(self, pair, opt, torch_state: dict, conv: float, torch_params: dict, params_before: dict) -> np.ndarray:
        """What the conventions moved `pair`'s weight by at this step, per element in paddle's layout:
        their relative effect times the step's change of the weight; added to its drift."""
        delta = pair.to_paddle({t: np.subtract(torch_params[t], params_before[t]) for t in pair.torch})
        rule = self._rule_rel(pair, opt, torch_state)
        if np.ndim(rule):
            self.rule_gap = max(self.rule_gap, float(np.max(rule, initial=0.0)))
        rel = np.sqrt(conv ** 2 + np.square(rule))
        moved = np.multiply(np.abs(delta, out=delta), rel, dtype=np.float32)  # as a row's budget takes it
        if pair.paddle in self.drift:
            self.drift[pair.paddle] += moved
        else:
            self.drift[pair.paddle] = moved.astype(np.float64)
        return moved

    def _rule_rel(self, pair, opt, torch_state: dict):
        """The relative change of the step paddle's own update rule makes, per element: RMSProp's
        sqrt(v + eps) against torch's sqrt(v) + eps; Adamax's epsilon on the norm, not the gradient
        (upstream.ADAMAX_EPSILON: its norm moves by at most eps). 0.0 for another optimizer."""
        kind = type(self.opt).__name__
        key = {"Adamax": "exp_inf", "RMSProp": "square_avg"}.get(kind)  # the state the rule reads
        if key is None or any(key not in torch_state.get(t, {}) for t in pair.torch):
            return 0.0
        eps = float(opt.param_groups[0]["eps"])
        held = pair.to_paddle({t: torch_state[t][key].detach().cpu().numpy().astype(np.float64) for t in pair.torch})
        if kind == "Adamax":
            return np.minimum(eps / np.maximum(held - eps, eps), 1.0)
        torch_denom = np.sqrt(held) + eps
        return np.abs(np.sqrt(held + eps) - torch_denom) / torch_denom

    def _compare(self, k: int, model, opt, params_before: dict, ref_params: dict, ref_state: dict, grads: dict,
                 state_before: dict):
        conv = self._conventions(grads)
        torch_params, torch_state = _torch_side(model, opt)
        for pair in self._stepped(grads):
            want = pair.to_paddle(torch_params)
            e_ref = np.subtract(want, pair.to_paddle(ref_params), dtype=np.float32)  # float64's rounded first
            moved = self._moved(pair, opt, torch_state, conv, torch_params, params_before)
            self._row(k, pair, "", want, self.params[pair.paddle].numpy(), e_ref, moved)
            for acc, key in STATE_OF_KIND.get(type(self.opt).__name__, TORCH_STATE_OF).items():
                holder = self.opt._accumulators.get(acc, {}).get(self.params[pair.paddle].name)
                if holder is None or any(key not in torch_state.get(t, {}) or key not in ref_state.get(t, {})
                                         for t in pair.torch):
                    continue
                want_s = pair.to_paddle({t: torch_state[t][key].detach().cpu().numpy() for t in pair.torch})
                ref_s = pair.to_paddle({t: ref_state[t][key].numpy() for t in pair.torch})
                # the conventions scale the terms the new state is summed from, whose size |new| + |old| bounds
                bound = np.abs(want_s)
                olds = {t: state_before.get(t, {}).get(key) for t in pair.torch}
                if any(v is not None for v in olds.values()):
                    bound += np.abs(pair.to_paddle({t: np.zeros(params_before[t].shape, np.float32) if v is None else
                                                    v.detach().cpu().numpy() for t, v in olds.items()}))
                bound *= conv
                if acc == "inf_norm":  # Adamax's: paddle's rule puts epsilon on it (upstream.ADAMAX_EPSILON)
                    bound += float(opt.param_groups[0]["eps"])
                self._row(k, pair, f" {acc}", want_s, holder.numpy(), np.subtract(want_s, ref_s, dtype=np.float32),
                          bound)

    def _row(self, k, pair, what, want, got, e_ref, extra):
        self.rows.append(judge("optimizer", k, pair.torch_name + what, pair.paddle + what, want, got, e_ref, extra))


def set_to_start(model, before: dict) -> dict:
    """The parameters (by name) of `model`, a float64 copy, set with their gradients to those a step
    started from (`before`: "params" and "grads", widened on the way)."""
    import torch
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(before["params"][n])
            g = before["grads"].get(n)
            if g is None:
                p.grad = None
            elif p.grad is not None and p.grad.shape == g.shape:
                p.grad.copy_(g)  # the gradient it holds from the last step, overwritten
            else:
                p.grad = g.double().cpu()
    return params


def own_state(state: dict, dtype) -> dict:
    """A torch optimizer's state dict to load into an optimizer over parameters of `dtype`: its floating
    tensors in that dtype and its step counts, each a tensor of its own. Torch keeps a loaded step count
    (and a tensor already of the parameters' dtype) as it is given and adds to it in place: loading
    `state` itself and stepping would move the step counts of `state`, and every later load of it (the
    what-ifs of a failing step, one after another) would start a step or more late."""
    import torch

    def own(key, value):
        if not isinstance(value, torch.Tensor):
            return copy.deepcopy(value)
        return value.to(dtype, copy=True) if key != "step" and value.is_floating_point() else value.clone()
    return {**state, "state": {index: {k: own(k, v) for k, v in s.items()} for index, s in state["state"].items()}}


def load_own_state(opt, state: dict, dtype) -> None:
    """`state`, a torch optimizer's state dict, into `opt`, an optimizer over parameters of `dtype`, as
    opt.load_state_dict(own_state(state, dtype)) leaves it: copied into the tensors `opt` already holds
    where it holds state of the same form (the same keys, tensors of the same shapes, groups with the
    same settings named), without a state dict's copies and checks; loaded as a state dict otherwise
    (its first state, one of another form, an optimizer with hooks on loading). `state` stays as it was."""
    import torch
    params = [p for g in opt.param_groups for p in g["params"]]
    saved, held = state["state"], opt.state
    groups = state["param_groups"]
    names = lambda g: set(g) - {"params", "param_names"}
    hooked = getattr(opt, "_optimizer_load_state_dict_pre_hooks", None) or getattr(
        opt, "_optimizer_load_state_dict_post_hooks", None)
    same = (not hooked and len(groups) == len(opt.param_groups)
            and all(names(g) == names(h) for g, h in zip(groups, opt.param_groups))
            and len(saved) == len(held) and all(0 <= i < len(params) and params[i] in held for i in saved))
    if same:
        for i, values in saved.items():
            own = held[params[i]]
            if own.keys() != values.keys() or any(
                    isinstance(v, torch.Tensor) != isinstance(own[k], torch.Tensor)  # (a step count keeps its dtype)
                    or (isinstance(v, torch.Tensor) and (v.shape != own[k].shape
                                                         or own[k].dtype != (v.dtype if k == "step" else dtype)))
                    for k, v in values.items()):
                same = False
                break
    if not same:
        opt.load_state_dict(own_state(state, dtype))
        return
    for i, values in saved.items():
        own = held[params[i]]
        for k, v in values.items():
            if isinstance(v, torch.Tensor):
                own[k].copy_(v)  # widened to the reference's dtype on the way (a step count: as it is)
            else:
                own[k] = copy.deepcopy(v)
    for g, h in zip(groups, opt.param_groups):
        for k in names(g):
            h[k] = copy.deepcopy(g[k])


def _squared(a: np.ndarray) -> float:
    """The sum of the squares of an array's elements, in its dtype; numpy's own loop, not BLAS's dot,
    whose threads wait for cores the frameworks' threads hold (a hundred times slower on two cores)."""
    flat = a.ravel(order="K")  # in memory's order: a view of a transposed array too
    return float(np.einsum("i,i->", flat, flat))


def _torch_side(model, opt) -> tuple[dict, dict]:
    """torch's parameters (numpy, by name) and its optimizer's state, by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return ({n: p.detach().cpu().numpy() for n, p in model.named_parameters()},
            {names[id(p)]: s for p, s in opt.state.items()})
