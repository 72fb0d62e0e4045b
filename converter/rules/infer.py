"""Infer rules from a torch model and its paddle port by walking module types.

Each layer family gives its rules (the layer registry); then every 2-D weight's layout is checked
against the paddle tensor it fills (rules/orient.py): by shape where shapes decide, by running the
layer where they cannot (a square weight), so that an HF Conv1D, a `paddle.compat.nn.Linear`
(torch's layout) and a square attention projection all come out right.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import UserError
from ..families import PortedLayer, lookup, paddle_own_keys, paddle_type_fits, torch_own_keys
from .orient import describe, orient
from .ruleset import RuleSet, parse_ruleset


def _has_state(torch_module) -> bool:
    return next(iter(torch_module.state_dict(keep_vars=True)), None) is not None


def _own_keys_by_name(pair: PortedLayer) -> None:
    """A module with no registry entry: its own tensors keep their names, untransposed."""
    paddle_keys = set(paddle_own_keys(pair.paddle_layer))
    # a buffer the paddle layer holds without saving it (persistable=False) is still torch's tensor's
    # counterpart: mapped, so that the verifier says no checkpoint reaches it
    paddle_keys |= {n for n, _ in pair.paddle_layer.named_buffers(include_sublayers=False)}
    params = {n for n, _ in pair.torch_module.named_parameters(recurse=False)}
    for name in torch_own_keys(pair.torch_module):
        if name in paddle_keys:
            pair.rename(name)
        elif name in params:
            pair.problems.append(f"parameter '{pair.torch_key(name)}' has no counterpart '{pair.paddle_key(name)}' in paddle "
                                 f"{type(pair.paddle_layer).__name__}; give it the same name or write a rule")
        else:
            pair.drop(name)  # a buffer the paddle port does not keep (e.g. position_ids)


def same_tensor_groups(named) -> list[list[str]]:
    """The names, from (name, tensor) pairs, that name one tensor object with others: each group in
    the order the names came, only groups of two or more (a head tied to the embedding)."""
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in named:
        by_tensor.setdefault(id(tensor), []).append(name)
    return [names for names in by_tensor.values() if len(names) > 1]


def tied_tensors(torch_model) -> dict[str, set[str]]:
    """Each state-dict key whose torch tensor other keys hold too, with those other keys; in any
    order of registration."""
    return {k: set(keys) - {k} for keys in same_tensor_groups(torch_model.state_dict(keep_vars=True).items())
            for k in keys}


def _tied_child(child, path: str, tied: dict[str, set[str]]) -> dict[str, str] | None:
    """Each state key of a torch module whose every tensor another module holds too, with one of
    those other keys; or None."""
    keys = [f"{path}.{k}" if path else k for k in child.state_dict(keep_vars=True)]
    elsewhere = {k: sorted(tied.get(k, set()) - set(keys)) for k in keys}
    return {k: others[0] for k, others in elsewhere.items()} if keys and all(elsewhere.values()) else None


def _pair_children(t_mod, p_layer, t_path, p_path, problems, rules, tied):
    t_children = [(n, c) for n, c in t_mod.named_children() if _has_state(c)]
    p_children = dict(p_layer.named_children())
    paired, t_left = [], []
    for name, child in t_children:
        if name in p_children:
            paired.append((name, child, name, p_children.pop(name)))
        else:
            t_left.append((name, child))
    if t_left:  # a paddle layer named as a torch module without state holds its own buffers (a rotary table)
        named = {n for n, _ in t_mod.named_children()}
        p_left = [(n, c) for n, c in p_children.items() if c.state_dict() and n not in named]
        if len(p_left) != len(t_left):  # modules whose tensors are all tied to others' need none in paddle
            ties = [_tied_child(child, f"{t_path}.{name}" if t_path else name, tied) for name, child in t_left]
            if all(ties):  # only when nothing else is left over: never a cause to pair the rest by order
                for tie in ties:
                    rules.extend({"kind": "drop", "key": k, "comment": f"tied to '{other}' in torch; the paddle port "
                                  "has no such layer (it computes this from that tensor)"} for k, other in tie.items())
                t_left = []
        if len(p_left) == len(t_left):
            paired.extend((tn, tc, pn, pc) for (tn, tc), (pn, pc) in zip(t_left, p_left))
        else:
            for name, _ in t_left:
                full = f"{t_path}.{name}" if t_path else name
                problems.append(f"torch module '{full}' has no paddle sublayer of the same name under "
                                f"'{p_path or '<root>'}'; name it the same or write the rules by hand")
    return paired


def _walk(t_mod, p_layer, t_path, p_path, rules, problems, measured, tied) -> None:
    family = lookup(t_mod, p_layer)
    pair = PortedLayer(t_path, p_path, t_mod, p_layer)
    if family is not None and family.convert is not None:
        if not paddle_type_fits(family, p_layer):
            problems.append(f"torch '{t_path or '<root>'}' is {type(t_mod).__name__} but paddle "
                            f"'{p_path or '<root>'}' is {type(p_layer).__name__}; expected one of "
                            f"{', '.join(family.paddle_types)}")
            return
        family.convert(pair)
    else:  # no entry, or a family without weight rules: its own tensors keep their names
        _own_keys_by_name(pair)
    orient(pair, family)
    rules.extend(pair.rules)
    problems.extend(pair.problems)
    measured.extend(pair.measured)
    if family is not None and family.owns_children:
        return
    for t_name, t_child, p_name, p_child in _pair_children(t_mod, p_layer, t_path, p_path, problems, rules, tied):
        _walk(t_child, p_child, f"{t_path}.{t_name}" if t_path else t_name,
              f"{p_path}.{p_name}" if p_path else p_name, rules, problems, measured, tied)


def paddle_aliases(paddle_model) -> dict[str, list[str]]:
    """State-dict keys that name the same paddle tensor as an earlier key, under that earlier key."""
    return {keys[0]: keys[1:] for keys in same_tensor_groups(paddle_model.state_dict().items())}


def infer_ruleset(torch_model, paddle_model, name: str = "inferred", partial: bool = False) -> RuleSet:
    """The rules that map the torch model's state dict onto the paddle model's, found by walking
    both. Where some cannot be found: a UserError, or (`partial`) the rules found so far with what
    is left listed under `open`, for a user to complete."""
    rules: list[dict] = []
    problems: list[str] = []
    measured: list = []
    _walk(torch_model, paddle_model, "", "", rules, problems, measured, tied_tensors(torch_model))
    problems = sorted(problems)
    if problems and not partial:
        raise UserError(f"cannot infer a mapping from the two models ({len(problems)} problem(s)); "
                        "fix the port or pass --mapping:", problems)
    aliases = paddle_aliases(paddle_model)
    for rule in rules:
        if rule["kind"] == "rename" and rule["to"] in aliases:
            rule["aliases"] = aliases[rule["to"]]
    description = ("Inferred from the torch and paddle models by module type, each 2-D weight's layout "
                   "measured. Review it, edit it, and pass it back with --mapping.")
    ruleset = parse_ruleset({"name": name, "description": description, "rules": rules}, name)
    return replace(ruleset, notes=tuple(describe(measured)), open=tuple(problems))
