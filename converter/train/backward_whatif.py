"""Causes of a per-layer backward culprit found by re-running: the paddle layer's local backward (on
torch's recorded inputs and output gradient) re-run with one of its settings changed.

The settings and the values tried come from the two models, as the forward check's re-runs take them
(verify/counterfactual.py): every plain value a paddle layer under the culprit keeps, changed to the
values its paired torch module keeps, the opposite flag, the complement of a fraction; and, for a
setting torch's module keeps under the same name (paddle's `_padding_idx`, torch's `padding_idx`),
torch's value, whole numbers included, where paddle's holds another value or none. A change under
which the culprit's gradient lands within its budget of torch's, and no other gradient of the layer
leaves it, is the cause."""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass

from ..diagnosis import Diagnosis, confirmed_cause, went
from .result import layer_of

MAX_RUNS = 120  # re-runs of one layer's local backward
MAX_SECONDS = 20.0
KIND = "setting"


@dataclass(frozen=True)
class Found:
    where: str  # the paddle layer's path
    layer_type: str
    setting: object  # the counterfactual.Setting changed
    ratio: float


def _bare(name: str) -> str:
    return name.lstrip("_").lower()


def _options(root, root_path: str, counterpart) -> list:
    """(path, layer, [Setting]) for `root` and each layer inside it; `counterpart(path)`: the paired
    torch module of a paddle layer, or None."""
    from ..verify.counterfactual import Setting, _framework_keys, _weighted, candidates, settings
    from ..verify.counterfactual_settings import constructor_parameter
    from ..verify.counterfactual_wrapping import named_layers
    paddle_keys, torch_keys = _framework_keys("paddle"), _framework_keys("torch")
    out = []
    for path, layer in named_layers(root, root_path):
        module = counterpart(path)
        theirs = settings(module, torch_keys) if module is not None else {}
        by_name = {_bare(k): v for k, v in theirs.items()}
        sizes = not _weighted(layer)
        here = []
        for name, value in settings(layer, paddle_keys).items():
            tried = candidates(value, list(theirs.values()), sizes)
            same = by_name.get(_bare(name))  # torch's value of the setting of the same name
            if same is not None and type(same) is type(value) and same != value and same not in tried:
                tried.append(same)
            here += [Setting(name, value, new, constructor_parameter(layer, name)) for new in tried]
        for name, value in vars(layer).items():  # unset on paddle's side (None), set on torch's
            same = by_name.get(_bare(name))
            if value is None and name not in paddle_keys and same is not None:
                here.append(Setting(name, None, same, constructor_parameter(layer, name)))
        if here:
            out.append((path, layer, here))
    return out


@contextlib.contextmanager
def culprit_layer(session, local, fb):
    """(torch's half of the culprit's local backward, the paddle layer in a copy of the model at the
    initial weights, as the per-layer backward's copy was, and `run()`: its local backward's rows
    again, by (torch name, paddle name)) while inside; None where the culprit is no unit of the
    per-layer backward."""
    from .backward import TorchLocal, layer_rows
    layer = layer_of(fb)
    half = next((h for h in local.halves if isinstance(h, TorchLocal) and h.unit.label == layer), None)
    if half is None:
        yield None
        return
    model = session.paddle_copy()
    try:
        root = dict(model.named_sublayers(include_self=True))[half.unit.ppath]
        p_call = local.p_calls.get(half.unit.ppath)

        def run():
            rows, _, _ = layer_rows(session, half, root, None, p_call)
            return {(r.torch, r.paddle): r for r in rows}
        yield half, root, run
    finally:
        session.done_with(model, "paddle")


def setting_causes(session, local, pairs, fb) -> list:
    """The confirmed causes of `fb`, a per-layer backward row over budget, among the settings of the
    paddle layer it compares (see the module's docstring); [] where no change reproduces torch's
    gradient, or the layer cannot be re-run."""
    torch_of = {p: t for t, p in pairs.modules.items()}

    def counterpart(path):
        t = torch_of.get(path)
        if t is None:
            return None
        return session.torch_model.get_submodule(t) if t else session.torch_model

    with culprit_layer(session, local, fb) as found:
        if found is None:
            return []
        half, root, run = found
        before = run()
        mine = before.get((fb.torch, fb.paddle))
        if mine is None or not mine.bad:  # (a Row is false when it fails)
            return []
        hits = _search(_options(root, half.unit.ppath, counterpart), run, fb, before)
    return [_diagnosis(h, fb, layer_of(fb)) for h in hits[:2]]


def _search(options: list, run, fb, before: dict) -> list:
    from ..verify.counterfactual import _run_changed
    until, hits = time.monotonic() + MAX_SECONDS, []
    tried = ((path, layer, setting) for path, layer, here in options for setting in here)
    for path, layer, setting in itertools.islice(tried, MAX_RUNS):
        if time.monotonic() > until:
            break
        got = _run_changed(layer, (setting,), run, dict)
        if got is None:
            continue
        mine = got.get((fb.torch, fb.paddle))
        newly_bad = any(r.bad and not before.get(k, r).bad for k, r in got.items())
        if mine is not None and mine.ratio is not None and mine.ratio <= 1 and not newly_bad:
            hits.append(Found(path, type(layer).__name__, setting, mine.ratio))
    return sorted(hits, key=lambda h: h.ratio)


def _diagnosis(found: Found, fb, layer: str) -> Diagnosis:
    setting = found.setting
    was, to = setting.said(setting.was), setting.said(setting.to)  # by the constructor's parameter where one sets it
    where = found.where or "<model>"
    cause = confirmed_cause(f"paddle's {where} ({found.layer_type}) has {was}", "its backward re-run on torch's "
                            "recorded inputs and output gradient", to, f"gives torch's gradient of '{fb.paddle}'",
                            went(fb.ratio, found.ratio))
    if setting.parameter:
        hint = f"construct paddle's {found.layer_type} with {to}"
    else:
        hint = f"make paddle's {where} compute with {to}"
    return Diagnosis(layer, cause, hint, kind=KIND)

