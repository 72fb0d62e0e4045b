"""One ported layer pair run on a probe input: the paddle layer with torch's tensors put in it (some
transposed), against the torch module on the same input. Measures which layout of a weight a
paddle layer computes with, for inference (rules/orient.py) and to confirm a what-if by re-running.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..paths import relative

PROBE_ROWS = 3  # rows of the probe input (batch 1, a few positions)


def _own_name(path: str, key: str) -> str | None:
    """`key`'s name in the module at `path`, where it is one of that module's own tensors."""
    name = relative(key, path)
    return name if name and "." not in name else None


def paddle_own(layer) -> dict:
    """The paddle layer's own parameters and buffers by name (not its sublayers')."""
    own = dict(layer.named_parameters(include_sublayers=False))
    own.update(layer.named_buffers(include_sublayers=False))
    return own


def torch_own(module) -> dict:
    """The torch module's own parameters and buffers by name (not its children's)."""
    own = dict(module.named_parameters(recurse=False))
    own.update(module.named_buffers(recurse=False))
    return own


class Weights:
    """The 2-D tensors of one ported layer whose rename rules may need a transpose."""

    def __init__(self, pair):
        self.pair = pair
        torch_state = torch_own(pair.torch_module)
        self.paddle = paddle_own(pair.paddle_layer)
        self.renames = {}  # torch own name -> paddle own name, for every own tensor with a plain rename
        for rule in pair.rules:
            if rule["kind"] == "rename":
                t_name, p_name = _own_name(pair.torch_path, rule["key"]), _own_name(pair.paddle_path, rule["to"])
                if t_name in torch_state and p_name in self.paddle:
                    self.renames[t_name] = p_name
        self.torch = {n: torch_state[n] for n in self.renames}
        self.reshapes = {r["key"]: r["shape"] for r in pair.rules if r["kind"] == "reshape"}
        self.transposed = {r["key"] for r in pair.rules if r["kind"] == "transpose"}

    def two_d(self) -> list[str]:
        return [n for n, t in self.torch.items() if t.dim() == 2]

    def symmetric(self, name: str) -> bool:
        """Whether torch's square tensor is its own transpose (or its values are unknown): both
        layouts hold it alike."""
        tensor = self.torch[name]
        if tensor.is_meta:
            return True
        values = tensor.detach().float().cpu().numpy()
        return bool(np.array_equal(values, values.T))

    def fits(self, name: str) -> tuple[bool, bool]:
        """(as is, transposed): whether each layout of torch's tensor fits the paddle tensor's shape."""
        shape = tuple(self.torch[name].shape)
        want = tuple(self.paddle[self.renames[name]].shape)
        return want == shape, want == shape[::-1]


def _run_torch(module, x: np.ndarray):
    import torch
    weight = next(iter(module.parameters(recurse=False)), None)
    dtype = weight.dtype if weight is not None and weight.is_floating_point() else torch.float32
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(torch.from_numpy(x).to(dtype))
    finally:
        module.train(training)
    return out.float().numpy().astype(np.float64) if isinstance(out, torch.Tensor) else None


def _run_paddle(weights: Weights, x: np.ndarray, transposed: set[str]):
    """The paddle layer's output on `x` with torch's tensors in it (each of `transposed` transposed),
    leaving the layer's own tensors as they were."""
    import paddle
    layer = weights.pair.paddle_layer
    held = dict(layer._parameters), dict(layer._buffers)
    try:
        for t_name, p_name in weights.renames.items():
            value = weights.torch[t_name].detach().float().cpu().numpy()
            key = weights.pair.torch_key(t_name)
            if key in weights.reshapes:
                value = value.reshape(weights.reshapes[key])
            if t_name in transposed:
                value = value.T
            table = layer._parameters if p_name in layer._parameters else layer._buffers
            table[p_name] = paddle.to_tensor(np.ascontiguousarray(value), dtype=weights.paddle[p_name].dtype)
        training = layer.training
        layer.eval()
        try:
            with paddle.no_grad():
                out = layer(paddle.to_tensor(x.astype(np.float32)))
        finally:
            layer.train() if training else None
    finally:
        layer._parameters.clear()
        layer._parameters.update(held[0])
        layer._buffers.clear()
        layer._buffers.update(held[1])
    return out.astype("float32").numpy().astype(np.float64) if isinstance(out, paddle.Tensor) else None


def measure(weights: Weights, names: list[str]) -> set[str] | None:
    """The square weights among `names` that the paddle layer wants transposed, found by running it
    once per candidate layout; None where no candidate alone reproduces torch's output (a layer that
    cannot be run on its own, or that no layout makes match)."""
    pair = weights.pair
    if next(pair.paddle_layer.children(), None) is not None or next(pair.torch_module.children(), None) is not None:
        return None  # a layer whose forward runs sublayers: their weights are not in place yet
    unset = set(dict(pair.paddle_layer.named_parameters(include_sublayers=False))) - set(weights.renames.values())
    if unset or any(t.is_meta for t in weights.torch.values()):
        return None  # a paddle parameter the probe would leave unset, or torch's values unknown
    width = weights.torch[names[0]].shape[0]  # the square weights' width: the probe input's last axis
    x = np.random.default_rng(0).standard_normal((1, PROBE_ROWS, width))
    try:
        reference = _run_torch(pair.torch_module, x)
    except Exception:  # noqa: BLE001 - a layer that takes other inputs: not measurable alone
        return None
    if reference is None:
        return None
    fixed = {n for n in weights.renames if n not in names and pair.torch_key(n) in weights.transposed}
    scale = 1e-3 * (1.0 + float(np.abs(reference).max(initial=0.0)))
    close = []
    for flags in itertools.product((False, True), repeat=len(names)):
        transposed = fixed | {n for n, flag in zip(names, flags) if flag}
        try:
            got = _run_paddle(weights, x, transposed)
        except Exception:  # noqa: BLE001 - this layout does not run (e.g. a reshape inside the layer)
            continue
        if got is not None and got.shape == reference.shape and float(np.abs(got - reference).max()) <= scale:
            close.append(transposed & set(names))
    return close[0] if len(close) == 1 else None


def runs_transposed(torch_module, paddle_layer) -> bool:
    """Whether the paddle layer, given torch's tensors under the same names with its weight transposed,
    reproduces the torch module's output on a probe input (and does not with it as is): a
    what-if confirmed by running it."""
    from . import PortedLayer
    pair = PortedLayer("", "", torch_module, paddle_layer)
    own = paddle_own(paddle_layer)
    pair.rules = [{"kind": "rename", "key": n, "to": n} for n, _ in torch_module.named_parameters(recurse=False)
                  if n in own]
    weights = Weights(pair)
    if "weight" not in weights.renames or weights.symmetric("weight") or weights.fits("weight") != (True, True):
        return False
    return measure(weights, ["weight"]) == {"weight"}
