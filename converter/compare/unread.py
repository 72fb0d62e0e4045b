"""Whether a model reads each of its tensors, measured: in one run of the model on the spec's inputs,
each layer's call is run again on that call's own inputs with one of its own tensors perturbed in
place (then put back); a tensor whose perturbation leaves its layer's output unchanged is checked
again at the model's outputs, all of those at once. A tensor whose perturbation changes neither is
not read on these inputs; one whose layer never runs is measured at the model's outputs alone.

The same measurement serves both frameworks, through their adapters (frameworks/)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

MODEL = ""  # the path of the model itself


@dataclass
class Perturbation:
    """What perturbing one tensor did. `read`: None where it could not be measured (`why` says
    why). `change`: the largest change of an output element it made (inf where one became NaN or
    infinite). `at`: the layer whose output changed, MODEL for the model's outputs; the tensor's
    own layer where nothing changed. `ran`: whether the tensor's own layer ran on these inputs.
    `written`: the forward wrote the tensor (a wrapper copying its own parameter into its inner
    layer's before calling it), so that the value it held before is never read."""

    key: str
    layer: str
    ran: bool
    read: bool | None
    change: float = 0.0
    at: str = MODEL
    why: str = ""
    written: bool = False  # the model's forward itself changed the tensor's value


def _owner(key: str) -> str:
    return key.rpartition(".")[0]


PERIOD = 4099  # a prime: the noise repeats along no axis of a tensor whose sizes are not its multiples


def perturbation(key: str, array: np.ndarray) -> np.ndarray:
    """A change of `array` that no rounding hides and no invariance of a layer cancels (a constant
    added before a softmax would be): normal noise of about half its largest magnitude (at least
    0.5), the same for a key on every run; a tensor larger than PERIOD repeats PERIOD values."""
    finite = array[np.isfinite(array)]
    scale = 0.5 * max(float(np.abs(finite).max()) if finite.size else 0.0, 1.0)
    rng = np.random.default_rng(zlib.crc32(key.encode("utf-8")))
    noise = rng.standard_normal(min(array.size, PERIOD)) * scale
    return np.resize(noise, array.shape)


class _Side:
    """One framework's tensors changed in place, and outputs as arrays."""

    def __init__(self, adapter, state: dict):
        self.adapter = adapter
        self.state = state
        self.is_torch = adapter.__name__.endswith("torch_side")

    def outputs(self, value) -> list[np.ndarray]:
        from ..tree import flatten
        return [np.asarray(self.adapter.to_numpy(t)) for t in flatten(value, self.adapter.is_tensor)]

    def clone(self, value):
        from ..tree import map_leaves
        return map_leaves(value, lambda t: t.clone(), self.adapter.is_tensor, copy=True)

    def checksum(self, key: str) -> int:
        """A checksum of the tensor's bits (read once, one tensor at a time)."""
        tensor = self.state[key]
        if self.is_torch:
            import torch
            tensor = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        return zlib.crc32(np.ascontiguousarray(tensor.numpy()).reshape(-1).view(np.uint8))

    def perturb(self, keys: list[str]) -> list:
        """Each tensor of `keys` perturbed in place; what puts them back."""
        saved = []
        try:
            for key in keys:
                saved.append(self._change_in_place(key, self.state[key]))
        except BaseException:
            self.put_back(saved)
            raise
        return saved

    def _change_in_place(self, key: str, tensor):
        """(tensor, its value before): the tensor perturbed in its own storage (paddle's LSTM shares
        its weights' storage with the flat buffer its kernel reads, so a paddle tensor takes its
        value from numpy, which copies into that storage)."""
        delta = perturbation(key, np.asarray(self.adapter.to_numpy(tensor), dtype=np.float64))
        if self.is_torch:
            import torch
            saved = tensor.detach().clone()
            with torch.no_grad():
                tensor.add_(torch.from_numpy(delta).to(tensor.device, tensor.dtype))
            return tensor, saved
        import paddle
        saved = tensor.numpy()  # its storage's own bits (bfloat16 as uint16)
        wide = tensor.astype("float32") if tensor.dtype in (paddle.bfloat16, paddle.float16) else tensor
        changed = wide + paddle.to_tensor(delta.astype(wide.numpy().dtype), place=tensor.place)
        tensor.set_value(changed.astype(tensor.dtype).numpy())
        return tensor, saved

    def put_back(self, saved: list) -> None:
        for tensor, value in saved:
            if self.is_torch:
                import torch
                with torch.no_grad():
                    tensor.copy_(value)
            else:
                tensor.set_value(value)


def _change(before: list[np.ndarray], after: list[np.ndarray]) -> float:
    """The largest change of an output element (inf where one became NaN, or the outputs' structure
    or shapes changed); 0.0 where every element is the same."""
    if len(before) != len(after) or any(a.shape != b.shape for a, b in zip(before, after)):
        return float("inf")
    worst = 0.0
    for a, b in zip(before, after):
        if a.dtype.kind not in "fc":
            if not np.array_equal(a, b):
                worst = float("inf")
            continue
        a, b = a.astype(np.float64), b.astype(np.float64)
        nan = np.isnan(a) != np.isnan(b)
        if nan.any():
            return float("inf")
        gap = np.abs(np.nan_to_num(a - b, nan=0.0, posinf=np.inf, neginf=np.inf))
        if gap.size:
            worst = max(worst, float(gap.max()))
    return worst


class _Pass:
    """The hooks of one measuring run: each layer's first call re-run once per own tensor."""

    def __init__(self, side: _Side, layers: dict, keys: list[str], exact: set[str]):
        self.side, self.layers, self.exact = side, layers, exact
        self.by_owner: dict[str, list[str]] = {}
        for key in keys:
            self.by_owner.setdefault(_owner(key), []).append(key)
        self.calls: dict[str, list] = {}
        self.ran: set[str] = set()
        self.busy = False
        self.readings: dict[str, Perturbation] = {}

    def hooks(self) -> list:
        handles = []
        for path in set(self.by_owner) | {MODEL}:
            layer = self.layers.get(path)
            if layer is not None:
                handles += self.side.adapter.add_hooks(layer, self._pre(path), self._post(path))
        return handles

    def _pre(self, path: str):
        def pre(layer, args, kwargs):
            if not self.busy:
                self.calls.setdefault(path, []).append((args, kwargs))
        return pre

    def _post(self, path: str):
        def post(layer, args, output):
            if self.busy:
                return
            call = self.calls[path].pop()
            if path in self.ran and path != MODEL:
                return
            self.ran.add(path)
            self.busy = True
            try:
                run = lambda: self.side.outputs(layer(*self.side.clone(call[0]), **self.side.clone(call[1])))
                self._at_layer(path, self.side.outputs(output), run)
                if path == MODEL:
                    self._at_model(self.side.outputs(output), run)
            finally:
                self.busy = False
        return post

    def _rerun(self, keys: list[str], run) -> list[np.ndarray]:
        saved = self.side.perturb(keys)
        try:
            return run()
        finally:
            self.side.put_back(saved)

    def _at_layer(self, path: str, before: list[np.ndarray], run) -> None:
        steady = None  # whether an unperturbed re-run gives the call's output: asked only where it matters
        for key in self.by_owner.get(path, ()):
            change = _change(before, self._rerun([key], run))
            if change and key in self.exact:
                steady = _change(before, run()) == 0.0 if steady is None else steady
                if not steady:
                    self.readings[key] = Perturbation(key, path, True, None, why=f"its layer '{path or '<model>'}' gives "
                                                 "other outputs when run again on the same inputs")
                    continue
            self.readings[key] = Perturbation(key, path, True, bool(change), change, path)

    def _at_model(self, before: list[np.ndarray], run) -> None:
        """Those not read at their own layer, or whose layer never ran, at the model's outputs: all
        perturbed at once, and one at a time where that changes them."""
        pending = [k for keys in self.by_owner.values() for k in keys
                   if k not in self.readings or self.readings[k].read is False and _owner(k) != MODEL]
        if not pending or _change(before, self._rerun(pending, run)) == 0.0:
            for key in pending:
                ran = _owner(key) in self.ran
                self.readings[key] = Perturbation(key, _owner(key), ran, False, at=_owner(key) if ran else MODEL)
            return
        steady = _change(before, run()) == 0.0
        for key in pending:
            ran = _owner(key) in self.ran
            if not steady:
                self.readings[key] = Perturbation(key, _owner(key), ran, None, why="the model gives other outputs when "
                                             "run again on the same inputs")
                continue
            change = _change(before, self._rerun([key], run))
            self.readings[key] = Perturbation(key, _owner(key), ran, bool(change), change, MODEL)


def measure_reads(adapter, model, inputs, device: str, state: dict, keys: list[str],
                  exact: set[str] = frozenset()) -> dict[str, Perturbation]:
    """A Perturbation for each of `keys` (entries of `state`, the model's tensors by state-dict key,
    each floating), from one run of the model on `inputs` (see the module's docstring). `exact`:
    keys for which a change must be the tensor's and not the layer's own randomness (a re-run
    without the perturbation is compared too). The model's forward raising: every key unmeasured,
    with its error."""
    side = _Side(adapter, state)
    measuring = _Pass(side, dict(adapter.named_layers(model)), keys, set(exact))
    before = {key: side.checksum(key) for key in keys}
    handles = measuring.hooks()
    try:
        adapter.forward(model, inputs, device)
    except Exception as exc:  # noqa: BLE001 - said in each reading; the check's own run reports the model's error
        why = f"the model's forward raised {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
        return {k: Perturbation(k, _owner(k), False, None, why=why) for k in keys}
    finally:
        for handle in handles:
            handle.remove()
    for key in keys:
        measuring.readings.setdefault(key, Perturbation(key, _owner(key), _owner(key) in measuring.ran, None,
                                                   why="the model itself was not run through its own call"))
        measuring.readings[key].written = side.checksum(key) != before[key]
    return measuring.readings
