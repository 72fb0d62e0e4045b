"""Cross-entropy what-ifs: which of torch's cross-entropy settings paddle's loss differs in.

First the settings that reproduce torch's own loss and gradient are found (the class axis,
class indices or probabilities as targets, the reduction, per-class weights read from torch's
gradient); then torch's cross-entropy is re-run in float64 on the same logits and targets with
one setting changed to each value paddle may have: the other reduction, each label present as
ignore_index (or the default), the label smoothing that fits (or none), the class weights read from
paddle's gradient, the targets taken the other way (probabilities against class indices), the
classes on another axis, the labels shifted by one position against the logits (a causal LM's
next-token loss) or not. The change whose loss and gradient land on paddle's names the cause.
The logits are the output the losses read, where the model returns others beside it (a cache)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

LANDS = 1e-4  # relative: far above fp32's noise on a loss and its gradient, far below any setting changed
IGNORED_TRIED = 32  # labels tried as ignore_index: a vocabulary's worth would take a float64 loss each
TORCH_IGNORED_TRIED = 4  # labels tried as torch's own ignore_index (each tried in every base setting)
DEFAULT_IGNORE = -100
# paddle 3.3's cross_entropy with label_smoothing turns class indices into smoothed probabilities,
# on which ignore_index applies to no position, and its mean then divides by every element of them
ELEMENTS = "mean over every class of every position"
# paddle 3.3's cross_entropy with a negative ignore_index and reduction "mean" divides by every label,
# the ignored ones included (upstream.CROSS_ENTROPY_IGNORED)
LABELS = "mean over every label"
SAME_WEIGHT = 1e-3  # relative spread of the weights read for one class that still counts as one weight


@dataclass(frozen=True)
class LossSetting:
    """One way of computing a cross-entropy, in torch's terms."""

    axis: int = 1  # the classes' axis of the logits
    soft: bool = False  # targets are probabilities with the logits' shape (else class indices)
    reduction: str = "mean"
    weight: tuple | None = None  # per-class weights
    ignore_index: int = DEFAULT_IGNORE
    label_smoothing: float = 0.0
    shift: int = 0  # labels from this many positions on scored against the logits before them (causal LMs)

    def changed(self, **kw) -> LossSetting:
        return dataclasses.replace(self, **kw)


@dataclass
class Side:
    """One side's cross-entropy on the shared logits: its loss and gradient with respect to them."""

    loss: float
    grad: np.ndarray


def read_output(*grads: list) -> int | None:
    """The index of the one output the losses read: the only one with a non-zero gradient in
    either side's gradients (`grads`, one list per side, one array per output), as a causal LM's
    logits beside its key/value cache; None where no output or several are read."""
    read = {i for side in grads for i, g in enumerate(side) if np.any(np.asarray(g) != 0)}
    return read.pop() if len(read) == 1 else None


def _targets(logits: np.ndarray, target: np.ndarray, s: LossSetting):
    """Torch's target for `s` on logits with the classes moved to axis 1, or None where it does not fit."""
    import torch
    if np.issubdtype(target.dtype, np.floating):
        if target.shape != logits.shape:
            return None
        t = torch.from_numpy(target).double().movedim(s.axis, 1)
        return t if s.soft else t.argmax(dim=1)
    if s.soft or not np.issubdtype(target.dtype, np.integer):
        return None
    if target.shape != logits.shape[:s.axis] + logits.shape[s.axis + 1:]:
        return None
    return torch.from_numpy(target).long()


def cross_entropy(logits: np.ndarray, target: np.ndarray, s: LossSetting) -> Side | None:
    """Torch's cross-entropy in float64 under setting `s`, or None where `s` does not apply."""
    import torch
    import torch.nn.functional as F
    t = _targets(logits, target, s)
    if t is None:
        return None
    x = torch.from_numpy(logits).double().requires_grad_(True)
    moved = x.movedim(s.axis, 1)
    if s.shift:  # the sequence: the first axis after the batch's and the classes'
        if moved.ndim < 3 or moved.shape[2] <= s.shift:
            return None
        moved = moved[:, :, :-s.shift]
        t = t[:, :, s.shift:] if s.soft else t[:, s.shift:]
    weight = None if s.weight is None else torch.tensor(np.nan_to_num(s.weight, nan=1.0), dtype=torch.float64)
    try:
        whole = s.reduction in (ELEMENTS, LABELS)
        if s.reduction == LABELS and (s.soft or s.weight is not None):
            return None  # every label counts alike: hard labels without class weights
        loss = F.cross_entropy(moved, t, weight=weight, reduction="sum" if whole else s.reduction,
                               ignore_index=s.ignore_index, label_smoothing=s.label_smoothing)
        if whole:
            loss = loss / (moved.numel() if s.reduction == ELEMENTS else t.numel())
        (grad,) = torch.autograd.grad(loss, [x])
    except (RuntimeError, IndexError, ValueError):
        return None
    return Side(float(loss.detach()), grad.numpy())


def lands(got: Side | None, side: Side, gradient: bool = True) -> bool:
    """`got`'s loss (and, with `gradient`, its gradient) is `side`'s within LANDS."""
    if got is None or not np.isfinite(got.loss) or not np.isfinite(side.loss):
        return False  # a NaN loss compares as equal to nothing (a NaN difference passed every test)
    scale = max(abs(got.loss), abs(side.loss), 1e-12)
    if abs(got.loss - side.loss) > LANDS * scale:
        return False
    if not gradient:
        return True
    g = float(np.max(np.abs(side.grad), initial=0.0))
    return float(np.max(np.abs(got.grad - side.grad), initial=0.0)) <= LANDS * g + 1e-12


def class_weights(logits: np.ndarray, target: np.ndarray, grad: np.ndarray, s: LossSetting) -> tuple | None:
    """The per-class weights a side's gradient shows under setting `s` (hard targets), scaled so that
    the smallest non-zero one is 1; None where the gradient is no weighted cross-entropy's, or where
    every class present has the same weight. A class absent from the batch has no weight to read:
    NaN (computed as 1; it adds nothing to this batch's loss)."""
    import torch
    t = _targets(logits, target, s)
    if t is None or s.soft:
        return None
    n_classes = logits.shape[s.axis]
    x = torch.from_numpy(logits).double().movedim(s.axis, -1)
    g = torch.from_numpy(np.asarray(grad, dtype=np.float64)).movedim(s.axis, -1)
    if s.shift:
        if x.ndim < 3 or x.shape[1] <= s.shift:
            return None
        x, g, t = x[:, :-s.shift], g[:, :-s.shift], t[:, s.shift:]
    rows, g = x.reshape(-1, n_classes), g.reshape(-1, n_classes).numpy()
    labels = t.reshape(-1).numpy()
    counted = labels != s.ignore_index  # positions the loss ignores carry no weight to read
    rows, g, labels = rows[torch.from_numpy(counted)], g[counted], labels[counted]
    if labels.min(initial=0) < 0 or labels.max(initial=0) >= n_classes:
        return None
    base = torch.softmax(rows, dim=1).numpy()
    base[np.arange(len(labels)), labels] -= 1.0  # an unweighted row's gradient, up to the reduction's scale
    norm = np.einsum("ij,ij->i", base, base)
    keep = norm > 1e-12
    scale = np.einsum("ij,ij->i", g, base)[keep] / norm[keep]  # each row's weight, up to one common factor
    labels = labels[keep]
    weights = np.ones(n_classes)
    present = np.unique(labels)
    for c in present:
        w = scale[labels == c]
        if np.ptp(w) > SAME_WEIGHT * max(float(np.max(np.abs(w))), 1e-30):
            return None
        weights[c] = float(np.mean(w))
    seen = weights[present]
    if np.any(seen < 0) or np.ptp(seen) <= SAME_WEIGHT * max(float(np.max(seen)), 1e-30):
        return None
    if np.any(seen <= SAME_WEIGHT * float(np.max(seen))):
        return None  # a class present that weighs nothing is an ignored label: ignore_index says so
    smallest = float(np.min(seen[seen > 0], initial=np.inf))
    if not np.isfinite(smallest):
        return None
    weights[np.setdiff1d(np.arange(n_classes), present)] = np.nan
    return tuple(float(w / smallest) for w in weights)


def _bases(logits: np.ndarray, target: np.ndarray):
    """The plain settings torch's loss may have, the likeliest first: each class axis, kind of
    target and reduction; then with the labels shifted by one (a causal LM); then ignoring one of
    the labels present (a padding label) instead of -100."""
    soft_choices = (False, True) if np.issubdtype(target.dtype, np.floating) else (False,)
    plain = [LossSetting(axis=axis, soft=soft, reduction=reduction) for axis in range(1, logits.ndim)
             for soft in soft_choices for reduction in ("mean", "sum")]
    shifts = (0, 1) if logits.ndim >= 3 else (0,)
    for shift in shifts:
        yield from (s.changed(shift=shift) for s in plain)
    for s in plain:
        for label in _labels(logits, target, s)[:TORCH_IGNORED_TRIED]:
            if label != DEFAULT_IGNORE:
                yield from (s.changed(shift=shift, ignore_index=label) for shift in shifts)


def torch_setting(logits: np.ndarray, target: np.ndarray, torch_side: Side) -> LossSetting | None:
    """The cross-entropy setting that reproduces torch's loss and gradient (with the class weights
    read from its gradient, or the label smoothing fitted to its loss, where the plain one does
    not), or None (not a cross-entropy we can vary)."""
    bases = list(_bases(logits, target))
    for s in bases:  # every plain one first: a label ignored reads as a class of weight 0 too
        if lands(cross_entropy(logits, target, s), torch_side):
            return s
    for s in bases:
        weight = class_weights(logits, target, torch_side.grad, s)
        if weight is not None and lands(cross_entropy(logits, target, s.changed(weight=weight)), torch_side):
            return s.changed(weight=weight)
        smoothing = _fitted_smoothing(logits, target, s, torch_side)
        if smoothing is not None and lands(cross_entropy(logits, target, s.changed(label_smoothing=smoothing)),
                                           torch_side):
            return s.changed(label_smoothing=smoothing)
    return None


def _labels(logits: np.ndarray, target: np.ndarray, s: LossSetting) -> list:
    """The labels present, the most frequent first (a padding label usually is), at most IGNORED_TRIED."""
    t = _targets(logits, target, s)
    if t is None or s.soft:
        return []
    labels, counts = np.unique(t.reshape(-1).numpy(), return_counts=True)
    order = sorted(range(len(labels)), key=lambda i: (-counts[i], labels[i]))
    return [int(labels[i]) for i in order[:IGNORED_TRIED]]


def changes(logits: np.ndarray, target: np.ndarray, base: LossSetting, paddle_side: Side):
    """(what changed, the setting) for each one-setting change of torch's, in the order they are tried."""
    yield "reduction", base.changed(reduction="sum" if base.reduction == "mean" else "mean")
    if base.reduction == "mean" and not base.soft and base.weight is None and ignored(target, base):
        yield "ignored labels counted", base.changed(reduction=LABELS)
    for label in [DEFAULT_IGNORE] + _labels(logits, target, base):
        if label != base.ignore_index:
            yield "ignore_index", base.changed(ignore_index=label)
    if base.label_smoothing:
        yield "label_smoothing", base.changed(label_smoothing=0.0)
    smoothing = _fitted_smoothing(logits, target, base.changed(label_smoothing=0.0), paddle_side)
    if smoothing is not None and not np.isclose(smoothing, base.label_smoothing, rtol=LANDS):
        yield "label_smoothing", base.changed(label_smoothing=smoothing)
    if base.label_smoothing and base.ignore_index >= 0 and not base.soft and base.reduction == "mean":
        yield "smoothed labels ignored", base.changed(ignore_index=DEFAULT_IGNORE, reduction=ELEMENTS)
    if logits.ndim >= 3:
        yield "shift", base.changed(shift=0 if base.shift else 1)
    weight = class_weights(logits, target, paddle_side.grad, base.changed(weight=None))
    if not _same_weights(weight, base.weight):
        yield "weight", base.changed(weight=weight)
    if np.issubdtype(target.dtype, np.floating) and target.shape == logits.shape:
        yield "soft", base.changed(soft=not base.soft)
    for axis in range(1, logits.ndim):
        if axis != base.axis:
            yield "axis", base.changed(axis=axis)


def ignored(target: np.ndarray, s: LossSetting) -> int:
    """How many of the labels setting `s` scores are its ignore_index (class-index targets)."""
    if s.soft or not np.issubdtype(target.dtype, np.integer):
        return 0
    scored = target[:, s.shift:] if s.shift and target.ndim >= 2 else target
    return int(np.count_nonzero(scored == s.ignore_index))


def scored(target: np.ndarray, s: LossSetting) -> int:
    """How many labels setting `s` scores, the ignored ones included."""
    return int(np.size(target[:, s.shift:] if s.shift and target.ndim >= 2 else target))


def _same_weights(a: tuple | None, b: tuple | None) -> bool:
    if a is None or b is None:
        return a is b
    return np.allclose(a, b, rtol=SAME_WEIGHT, equal_nan=True)


def _fitted_smoothing(logits, target, base: LossSetting, side: Side) -> float | None:
    """The label smoothing s whose loss is `side`'s, where `base` has none: the loss is linear in s."""
    if base.soft or base.label_smoothing:
        return None
    plain = cross_entropy(logits, target, base)
    full = cross_entropy(logits, target, base.changed(label_smoothing=1.0))
    if plain is None or full is None or full.loss == plain.loss:
        return None
    s = (side.loss - plain.loss) / (full.loss - plain.loss)
    return s if 0 < s < 1 else None


def what_if(logits: np.ndarray, target: np.ndarray, torch_side: Side, paddle_side: Side):
    """(what, torch's setting, the changed setting that lands on paddle's, whether its gradient lands
    too) or None. A change whose loss and gradient both land comes first; then one whose loss alone
    does, where nothing was fitted to that loss (paddle's soft-label gradient is softmax - target,
    its loss's derivative only where the target sums to 1 over the class axis)."""
    base = torch_setting(logits, target, torch_side)
    if base is None:
        return None
    tried = list(changes(logits, target, base, paddle_side))
    for gradient in (True, False):
        for what, changed in tried:
            if (gradient or what not in FITTED) and lands(cross_entropy(logits, target, changed), paddle_side, gradient):
                return what, base, changed, gradient
    return None


FITTED = ("label_smoothing", "weight")  # read from paddle's own loss or gradient


def _weights(weight: tuple | None) -> str:
    if weight is None:
        return "all alike (no weight=)"
    shown = "[" + ", ".join("?" if np.isnan(w) else f"{w:.3g}" for w in weight) + "] (relative"
    return shown + ("; ? a class absent from the batch)" if np.isnan(weight).any() else ")")


def explain(what: str, base: LossSetting, changed: LossSetting, shape: tuple, gradient: bool = True,
            target: np.ndarray | None = None) -> tuple[str, str]:
    """(cause, hint) for the one setting in which paddle's cross-entropy differs from torch's (`target`:
    the labels, for the counts a cause says)."""
    if what == "ignored labels counted":
        cause, hint = _counted(base, target)
    else:
        cause, hint = _explain(what, base, changed, shape)
    if not gradient:
        cause += (" (the loss; paddle's gradient is not that loss's derivative: with soft labels paddle takes "
                  "softmax - target, which holds only where the target sums to 1 over the class axis)"
                  if changed.soft else " (the loss; paddle's gradient differs from that loss's derivative)")
    return cause, hint


def _ignored(s: LossSetting) -> str:
    """What an ignore_index that lands ignores: one of the labels present (only those are tried
    besides the default), or the default's labels, if any."""
    if s.ignore_index == DEFAULT_IGNORE:
        return f"only labels {DEFAULT_IGNORE}, if any (ignore_index={DEFAULT_IGNORE}, the default)"
    return f"label {s.ignore_index} (ignore_index={s.ignore_index})"


def _counted(base: LossSetting, target: np.ndarray | None) -> tuple[str, str]:
    from ..compare.upstream import CROSS_ENTROPY_IGNORED
    n = scored(target, base) if target is not None else 0
    m = n - ignored(target, base) if target is not None else 0
    every, counted = (f"all {n} labels, the {n - m} labels {base.ignore_index} included", f"the {m} counted") if n \
        else ("every label, the ignored ones included", "the labels counted")
    return (f"ignored labels counted in the mean: paddle's loss divides the summed loss by {every}, torch's by "
            f"{counted}; torch's summed cross-entropy divided by every label is paddle's loss, its mean over the "
            f"labels counted is not: confirmed by re-running ({CROSS_ENTROPY_IGNORED.said()}'s cross_entropy does so "
            "under a negative ignore_index and reduction 'mean')",
            f"compute paddle's loss as the sum with reduction='none' divided by the labels counted: "
            f"losses.sum() / (labels != {base.ignore_index}).sum()")


def _explain(what: str, base: LossSetting, changed: LossSetting, shape: tuple) -> tuple[str, str]:
    if what == "reduction":
        return (f"reduction: paddle's cross-entropy is reduced by '{changed.reduction}', torch's by "
                f"'{base.reduction}'; torch's with reduction='{changed.reduction}' is paddle's loss",
                "use the same reduction on both sides")
    if what == "ignore_index":
        return (f"ignore_index: paddle's loss ignores {_ignored(changed)}, torch's {_ignored(base)}; torch's "
                f"cross-entropy with ignore_index={changed.ignore_index} is paddle's loss",
                f"use the same ignore_index on both sides (torch's is {base.ignore_index}; both default to "
                f"{DEFAULT_IGNORE})")
    if what == "label_smoothing":
        theirs = f"{base.label_smoothing:.3g}" if base.label_smoothing else "none"
        ours = f"label smoothing {changed.label_smoothing:.3g}" if changed.label_smoothing else "no label smoothing"
        return (f"paddle's loss is the cross-entropy with {ours}; torch's has {theirs}",
                "use the same label smoothing on both sides (paddle: F.label_smooth or label_smoothing)")
    if what == "smoothed labels ignored":
        return (f"label smoothing with ignore_index: paddle's cross_entropy with label_smoothing="
                f"{base.label_smoothing:.3g} and ignore_index={base.ignore_index} ignores no position and divides "
                "its sum by every class of every position (paddle 3.3 smooths the labels into probabilities, on which "
                f"ignore_index does not apply); torch's with ignore_index={DEFAULT_IGNORE} and its sum divided by the "
                f"{int(np.prod(shape))} logits is paddle's loss",
                "drop the ignored positions before paddle's loss (keep = labels != ignore_index; "
                "cross_entropy(logits[keep], labels[keep], label_smoothing=...)), or smooth by hand")
    if what == "shift":
        shifted, plain = ("paddle", "torch") if changed.shift else ("torch", "paddle")
        return (f"label shift: {shifted}'s loss scores the logits of each position against the next position's "
                f"label (a causal LM's next-token loss, logits[:, :-1] against labels[:, 1:]), {plain}'s against the "
                f"position's own label; torch's cross-entropy with the labels {'shifted' if changed.shift else 'unshifted'}"
                " is paddle's loss", "shift once, on both sides alike: in the loss, or in the model where it computes "
                "the loss from labels (HF's causal LMs shift inside), never in both")
    if what == "weight":
        return (f"class weights: paddle's loss weighs the classes {_weights(changed.weight)}, torch's "
                f"{_weights(base.weight)}; torch's cross-entropy with paddle's weights is paddle's loss",
                "give both losses the same per-class weight= (or none on both)")
    if what == "soft":
        soft, hard = ("paddle", "torch") if changed.soft else ("torch", "paddle")
        return (f"soft labels: {soft}'s loss takes the targets as probabilities, {hard}'s as class indices (their "
                f"argmax); torch's cross-entropy with the targets as {'probabilities' if changed.soft else 'class indices'}"
                " is paddle's loss",
                "hand both losses the same kind of target: paddle's cross_entropy takes probabilities with "
                "soft_label=True, torch's when the target is float with the logits' shape")
    default = " (paddle's cross_entropy defaults to axis=-1)" if changed.axis == len(shape) - 1 else ""
    return (f"class axis: paddle's loss takes the classes on axis {changed.axis} of the {list(shape)} output{default}, "
            f"torch's on axis {base.axis}; torch's cross-entropy over axis {changed.axis} is paddle's loss",
            f"pass axis={base.axis} to paddle's cross_entropy (torch's cross_entropy takes the classes on dim 1)")
