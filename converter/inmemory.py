"""The plan between two models in memory: the torch model's state dict mapped onto the paddle
model's (verify-port's weights), and what the paddle model keeps of its own (state no torch tensor
fills, buffers no checkpoint reaches) with notes on it."""

from __future__ import annotations

import functools

import numpy as np

from . import dtypes
from .errors import UserError
from .layout import contiguous
from .rules import MappingPlan, build_plan, resolve_mapping
from .rules.ruleset import RuleSet


def convert_in_memory(torch_model, paddle_model, mapping=None):
    """Torch model weights as the paddle model's state dict (numpy arrays), and the plan used. The
    paddle model's own buffers that no torch tensor fills (see plan_in_memory) are not in it."""
    plan, ruleset, source = plan_in_memory(torch_model, paddle_model, mapping)
    state = {}
    for entry in plan.entries:
        array = contiguous(entry.compute(source.read))
        state[entry.name] = array
        for alias in entry.aliases:
            state[alias] = array
    return state, plan, ruleset, source


def plan_in_memory(torch_model, paddle_model, mapping=None, source=None, unfilled_ok=None):
    """(plan, rule set, torch state dict as a source) mapping the torch model's state dict onto the
    paddle model's. `mapping`: a rule set, a rule-set name or file, or None to infer the rules.
    Persistable buffers of the paddle model that no torch tensor fills (a causal mask, position
    ids, rotary tables it computes itself) are not targets: they stay as the paddle model built
    them (the paddle state-dict keys the plan does not write), with notes (plan.notes) comparing
    them with torch's buffers of the same name in the paired module, where there are such. A parameter
    no torch tensor fills is left as the paddle model holds it too (plan.unfilled, with a note; the
    verifier measures whether the model reads it: compare/unread.py) where nothing else is wrong with
    the plan and `unfilled_ok` (by default: where both models are whole in memory, `source` not
    given); else it is a problem of the plan. `source`: the torch model's tensors read from elsewhere
    (its checkpoint, for a model on the meta device), instead of its state dict."""
    from .frameworks.paddle_side import state_dict_infos
    from .io.torch_io import StateDictSource
    from .rules.infer import infer_ruleset
    if isinstance(mapping, RuleSet):
        ruleset = mapping
    else:
        ruleset = resolve_mapping(str(mapping)) if mapping else infer_ruleset(torch_model, paddle_model)
    ruleset = ruleset.with_params(_model_config(torch_model) | ruleset.params)
    targets = state_dict_infos(paddle_model)
    unfilled_ok = source is None if unfilled_ok is None else unfilled_ok
    if source is None:
        state_dict = torch_model.state_dict()
        left_out = _tied_copies_paddle_lacks(state_dict, ruleset, targets)
        source = StateDictSource({k: t for k, t in state_dict.items() if k not in left_out})
    loose = functools.cache(lambda: loose_plan(source.infos, ruleset))  # asked for only where the model has buffers
    kept = _buffers_left_unfilled(loose, paddle_model)
    unloadable = _targets_not_persistable(loose, paddle_model)
    skipped = {part.source for entry in unloadable for part in entry.parts}
    try:
        plan = build_plan({k: v for k, v in source.infos.items() if k not in skipped}, ruleset,
                          {k: v for k, v in targets.items() if k not in kept}, unfilled_ok=unfilled_ok)
    except UserError as refused:  # torch tensors with no place in the paddle model: what their layers lack
        lacking = _lacking(refused, loose(), paddle_model, targets, torch_model)
        if lacking is None:
            raise
        raise lacking from refused
    plan.unloadable = unloadable
    plan.unfilled = _first_names(plan, paddle_model)
    plan.notes.extend(ruleset.notes)
    plan.notes.extend(unfilled_notes(plan.unfilled))
    plan.notes.extend(buffer_notes(torch_model, paddle_model, plan, kept))
    plan.notes.extend(_unloadable_notes(unloadable, paddle_model, source))
    return plan, ruleset, source


def _lacking(refused, loose, paddle_model, targets, torch_model) -> UserError | None:
    """A refusal whose only problems are torch tensors that the rules place in a paddle layer lacking
    them (a Linear built without its bias), said as what that layer lacks, and the constructor
    argument that builds them where rebuilding the layer finds one (frameworks/rebuild.py); None
    otherwise."""
    absent = [e for e in (loose.entries if loose is not None else ()) if e.name not in targets]
    layers = dict(paddle_model.named_sublayers())
    if not absent or len(absent) != len(refused.details) or any(e.name.rpartition(".")[0] not in layers for e in absent):
        return None
    first = absent[0]
    where, _, leaf = first.name.rpartition(".")
    said = (f"paddle's {where} ({type(layers[where]).__name__}) holds no '{leaf}', which torch's "
            f"'{first.parts[0].source}' {list(first.shape)} fills")
    more = f" ({len(absent) - 1} more such: {', '.join(e.name for e in absent[1:4])})" if len(absent) > 1 else ""
    change = _building_change(layers[where], [e for e in absent if e.name.rpartition(".")[0] == where], torch_model)
    if change is None:
        return UserError(f"{said}: build paddle's {where} with a '{leaf}' of that shape{more}")
    return UserError(f"{said}{more}: build it with {', '.join(f'{k}={v!r}' for k, v in change.items())}")


def _building_change(layer, lacked: list, torch_model) -> dict | None:
    """The constructor arguments whose change builds `layer` holding every tensor of `lacked` (plan
    entries at it) in torch's shapes, measured by rebuilding it without memory; None where none is
    found. Torch's module there (the one the first entry's tensor comes from) lends its same-named
    settings as values to try."""
    from .frameworks.rebuild import constructor_change
    source = lacked[0].parts[0].source.rpartition(".")[0]
    counterpart = dict(torch_model.named_modules()).get(source)
    return constructor_change(layer, {e.name.rpartition(".")[2]: tuple(e.shape) for e in lacked}, counterpart)


def _first_names(plan, paddle_model) -> list:
    """The plan's unfilled targets less those naming a paddle tensor that another name fills (a
    rule file that maps an LSTM's 'weight_ih_l0' without its alias '0.cell.weight_ih' fills both:
    the alias is added to its entry) or that an earlier unfilled one names."""
    state = paddle_model.state_dict()
    filled = {id(state[e.name]): e for e in plan.entries if e.name in state}
    seen, out = set(), []
    for info in plan.unfilled:
        tensor = id(state[info.name])
        if tensor in filled:
            filled[tensor].aliases += (info.name,)
        elif tensor not in seen:
            seen.add(tensor)
            out.append(info)
    return out


def unfilled_notes(unfilled) -> list[str]:
    """One note on the paddle parameters that no torch tensor fills (left as the paddle model holds
    them); what the model does with each is measured by the verifier (compare/onesided.py)."""
    if not unfilled:
        return []
    names = ", ".join(f"'{i.name}'" for i in unfilled[:SHOWN_BUFFERS]) + (
        f" and {len(unfilled) - SHOWN_BUFFERS} more" if len(unfilled) > SHOWN_BUFFERS else "")
    return [f"{len(unfilled)} paddle parameter(s) that no torch tensor fills are left as the paddle model holds them: "
            f"{names}"]


def _model_config(torch_model) -> dict:
    """The fields of an HF model's config (`model.config.to_dict()`), which a rule's `groups` or
    `count` may name (num_key_value_heads); {} for a model without one."""
    to_dict = getattr(getattr(torch_model, "config", None), "to_dict", None)
    try:
        fields = to_dict() if callable(to_dict) else {}
    except Exception:  # noqa: BLE001 - a config that cannot say its fields gives none
        return {}
    return fields if isinstance(fields, dict) else {}


def plan_for_loaded(torch_model, paddle_model, mapping=None, source=None):
    """plan_in_memory for a paddle model that keeps the weights it was loaded with: the rules given,
    else inferred from the two models, else the shipped set that fits torch's keys and the paddle
    model (an HF model against its PaddleNLP port); the inference's problems when none does.
    `source`: the torch model's tensors read from elsewhere, as plan_in_memory takes them."""
    if mapping:
        plan, ruleset, source = plan_in_memory(torch_model, paddle_model, mapping, source=source)
        how = "given"
    else:
        try:  # a shipped set that fills every paddle tensor comes before inferred rules that leave some
            plan, ruleset, source = plan_in_memory(torch_model, paddle_model, source=source, unfilled_ok=False)
            how = "inferred from the two models"
        except UserError as inferred:
            try:
                plan, ruleset, source = _shipped_plan(torch_model, paddle_model, inferred, source)
                how = "detected from torch's keys"
            except UserError as shipped:
                # the inferred rules, leaving paddle parameters unfilled; else what the search says
                if source is not None:
                    raise shipped from None
                try:
                    plan, ruleset, source = plan_in_memory(torch_model, paddle_model)
                except UserError:
                    raise shipped from None
                how = "inferred from the two models"
    plan.notes.insert(0, f"mapping 'loaded': the paddle model keeps the weights it was loaded with; each is checked "
                         f"bit for bit against torch's under the rule set '{ruleset.name}' ({how})")
    return plan, ruleset, source


def _shipped_plan(torch_model, paddle_model, inferred: UserError, source=None):
    from .io.torch_io import StateDictSource
    from .rules.detect import detect
    try:
        found = detect(source.infos if source is not None else StateDictSource(torch_model.state_dict()).infos)
        return plan_in_memory(torch_model, paddle_model, found.chosen.ruleset, source=source)
    except UserError:
        raise UserError(f"mapping 'loaded': {inferred.message.rstrip(':;')}; and no shipped rule set fits the two "
                        "models: give the rules that pair them (a spec's mapping, or a rule file with --mapping) "
                        "and set mapping = 'loaded' in the spec", inferred.details) from None


def paddle_state(paddle_model) -> dict[str, object]:
    """State-dict keys of the paddle model that hold state rather than weights: its buffers
    (persistable, not parameters) and its parameters that are not trained (stop_gradient: a
    BatchNorm's running statistics, which paddle keeps as parameters)."""
    trained = {id(p) for p in paddle_model.parameters() if not p.stop_gradient}
    state = {id(b) for _, b in paddle_model.named_buffers()} | {id(p) for p in paddle_model.parameters()}
    return {k: v for k, v in paddle_model.state_dict().items() if id(v) in state - trained}


def loose_plan(infos, ruleset: RuleSet) -> MappingPlan | None:
    """The plan of torch's keys (`infos`) under the rules, against no target model; None when the rules
    do not fit torch's keys (the plan against the paddle model's keys then says what is wrong)."""
    try:
        return build_plan(infos, ruleset, None)
    except UserError:
        return None


def _buffers_left_unfilled(loose, paddle_model) -> list[str]:
    """The paddle model's buffers that the rules fill from no torch tensor (all of them when the
    rules do not yet fit torch's keys). `loose()` gives loose_plan's plan."""
    buffers = paddle_state(paddle_model)
    if not buffers:
        return []
    if loose() is None:
        return sorted(buffers)
    filled = {name for entry in loose().entries for name in (entry.name, *entry.aliases)}
    return [k for k in buffers if k not in filled]


def paddle_unsaved_buffers(paddle_model) -> dict[str, object]:
    """The paddle model's buffers that its state dict leaves out (registered with persistable=False)."""
    saved = set(paddle_model.state_dict())
    return {k: v for k, v in paddle_model.named_buffers() if k not in saved}


def _targets_not_persistable(loose, paddle_model) -> list:
    """Plan entries whose target the paddle model holds as a buffer that is not persistable: the
    rules are right, but no checkpoint reaches such a buffer (HF BART's final_logits_bias registered
    with persistable=False in a port). Their torch tensors are left out of the plan. `loose()` gives
    loose_plan's plan."""
    unsaved = paddle_unsaved_buffers(paddle_model)
    if not unsaved or loose() is None:
        return []
    return [e for e in loose().entries if e.name in unsaved]


def unloadable_difference(entry, paddle_model, read) -> str:
    """What a not-persistable paddle buffer holds against the torch tensor the rules map onto it."""
    from .frameworks.paddle_side import to_numpy
    expected = entry.compute(read)
    if entry.dtype == "bfloat16":
        expected = dtypes.bf16_to_f32(expected)
    return _compare_arrays(f"torch's '{entry.parts[0].source}' under the mapping", expected,
                           to_numpy(paddle_unsaved_buffers(paddle_model)[entry.name]))


def _unloadable_notes(entries, paddle_model, source) -> list[str]:
    notes = []
    for e in entries:
        said = unloadable_difference(e, paddle_model, source.read)
        notes.append(f"paddle buffer '{e.name}' is not persistable: no checkpoint reaches it, so it keeps the value "
                     f"the paddle model built, which {'is ' if said.startswith('equal') else ''}{said}; register it "
                     "with persistable=True for the converted weights to fill it")
    return notes


def _ancestor_pairs(plan) -> dict[str, str]:
    """Paddle layer path -> torch module path: the layers the plan fills from a module's tensors,
    and their ancestors while both paths end in the same name (gptj.h.0.attn ~ transformer.h.0.attn)."""
    pairs: dict[str, str] = {}
    for entry in plan.entries:
        for name in (entry.name, *entry.aliases):
            for part in entry.parts:
                p, t = name.split(".")[:-1], part.source.split(".")[:-1]
                while True:
                    pairs.setdefault(".".join(p), ".".join(t))
                    if not p or not t or p[-1] != t[-1]:
                        break
                    p, t = p[:-1], t[:-1]
    return pairs


def _torch_buffer(torch_model, pairs: dict[str, str], key: str):
    """(torch key, tensor) of the torch buffer that a paddle buffer stands for: the one of the same
    name in the module paired with its layer (else on the same path), persistent or not; or None."""
    layer, _, name = key.rpartition(".")
    for path in dict.fromkeys([pairs.get(layer), layer]):
        if path is None:
            continue
        try:
            module = torch_model.get_submodule(path)
        except AttributeError:
            continue
        found = dict(module.named_buffers(recurse=False)).get(name)
        if found is not None:
            return f"{path}.{name}" if path else name, found
    return None


def _compare_buffer(t_key: str, t_value, p_value) -> str:
    import torch

    from .frameworks.paddle_side import to_numpy
    t = t_value.detach().cpu()
    t = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return _compare_arrays(f"torch's '{t_key}'", t, to_numpy(p_value))


def worst_gap(a: np.ndarray, b: np.ndarray, differ: np.ndarray | None = None) -> tuple[np.ndarray, tuple]:
    """|a - b| per element of two float64 arrays (inf where one of the two is NaN, 0 where both
    are; -1 outside `differ` where it is given), and the index of the largest (() for a scalar)."""
    gap = np.where(np.isnan(a) != np.isnan(b), np.inf, np.nan_to_num(np.abs(a - b), nan=0.0))
    if differ is not None:
        gap = np.where(differ, gap, -1.0)
    return gap, (np.unravel_index(int(np.argmax(gap)), gap.shape) if gap.ndim else ())


def _compare_arrays(what: str, t: np.ndarray, p: np.ndarray) -> str:
    """'equal to WHAT', or where paddle's array `p` differs from torch's `t`, with the worst element."""
    if t.shape != p.shape:
        return f"has shape {list(p.shape)} where {what} is {list(t.shape)}"
    floating = t.dtype.kind == "f" or p.dtype.kind == "f"
    if np.array_equal(t, p, equal_nan=floating):
        return f"equal to {what}"
    gap, at = worst_gap(t.astype(np.float64), p.astype(np.float64))
    shown = lambda v: f"{v.item():.9g}" if isinstance(v.item(), float) else repr(v.item())
    where = f" (the worst at {list(map(int, at))})" if gap.ndim else ""
    return (f"differs from {what} in {int(np.count_nonzero(gap))} of {gap.size} element(s){where}: "
            f"paddle {shown(p[at])}, torch {shown(t[at])}")


SHOWN_BUFFERS = 6


def buffer_notes(torch_model, paddle_model, plan, kept: list[str]) -> list[str]:
    """What the paddle buffers `kept` (no torch tensor fills them) hold against torch's
    counterparts: one note for those equal or without a counterpart, one for each that differs."""
    if not kept:
        return []
    pairs, state = _ancestor_pairs(plan), paddle_model.state_dict()
    same, alone, notes = [], [], []
    for key in kept:
        found = _torch_buffer(torch_model, pairs, key)
        if found is None:
            alone.append(key)
            continue
        said = _compare_buffer(*found, state[key])
        if said.startswith("equal"):
            same.append(key)
        else:
            notes.append(f"paddle buffer '{key}' (kept as the paddle model built it) {said}; the paddle model "
                         "computes with its own")
    listed = lambda keys: ", ".join(keys[:SHOWN_BUFFERS]) + (f" and {len(keys) - SHOWN_BUFFERS} more"
                                                           if len(keys) > SHOWN_BUFFERS else "")
    parts = []
    if same:
        parts.append(f"{len(same)} equal to torch's buffer of the same name ({listed(same)})")
    if alone:
        parts.append(f"{len(alone)} with no torch counterpart ({listed(alone)})")
    if len(kept) > len(same) + len(alone):
        parts.append(f"{len(kept) - len(same) - len(alone)} differing (below)")
    notes.insert(0, f"{len(kept)} paddle state tensor(s) (buffers, parameters it does not train) that no torch tensor "
                    "fills are kept as the paddle model built them: "
                    + "; ".join(parts))
    return notes


def _tied_copies_paddle_lacks(state_dict, ruleset, targets) -> set[str]:
    """Keys of tensors that torch ties to an earlier key (one storage, one layout) that the plan
    leaves to that key: those whose mapped names the paddle model does not have (a head tied to the
    embeddings where the paddle model computes its head from the embedding itself: PaddleNLP's T5
    with a tied head has no lm_head.weight), and those whose mapped names the earlier key writes
    already (paddle ties them too: its state dict lists the one tensor under both names, and the
    rules give the earlier key's target the other as an alias). A rule set that covers both tied and
    untied checkpoints maps the head."""
    from .io.torch_io import StateDictSource
    first, copies = {}, {}
    for key, t in state_dict.items():
        if t.numel() == 0:
            continue
        layout = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if layout in first:
            copies[key] = first[layout]
        else:
            first[layout] = key
    if not copies:
        return set()
    infos = StateDictSource(state_dict).infos
    names = _mapped_names(infos, ruleset)
    if names is None:  # a copy may write a name its original writes: map them apart
        rest = _mapped_names({k: v for k, v in infos.items() if k not in copies}, ruleset)
        own = _mapped_names({k: v for k, v in infos.items() if k in copies}, ruleset)
        if rest is None or own is None:
            return set()  # the plan with the paddle model's names will say what is wrong
        names = {**rest, **own}
    return {k for k, original in copies.items() if k in names
            and (not any(n in targets for n in names[k]) or set(names[k]) <= set(names.get(original, ())))}


def _mapped_names(infos, ruleset) -> dict[str, list[str]] | None:
    """Source key -> the target names (aliases included) the rules write from it, without the paddle
    model's names; None where the rules do not map these keys."""
    loose = loose_plan(infos, ruleset)
    if loose is None:
        return None
    names: dict[str, list[str]] = {}
    for entry in loose.entries:
        for part in entry.parts:
            names.setdefault(part.source, []).extend([entry.name, *entry.aliases])
    return names
