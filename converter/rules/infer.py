"""Infer rules from a torch model and its paddle port by walking module types.

Each layer family gives its rules (the layer registry); then every 2-D weight's layout is checked
against the paddle tensor it fills (rules/orient.py): by shape where shapes decide, by running the
layer where they cannot (a square weight), so that an HF Conv1D, a `paddle.compat.nn.Linear`
(torch's layout) and a square attention projection all come out right.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import UserError
from ..families import PortedLayer, kind_of, lookup, paddle_own_keys, paddle_type_fits, torch_own_keys
from ..families.probe import paddle_own, torch_own
from ..paths import join
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


def _tied_child(child, path: str, tied: dict[str, set[str]]) -> dict[str, str] | None:
    """Each state key of a torch module whose every tensor another module holds too, with one of
    those other keys; or None."""
    keys = [join(path, k) for k in child.state_dict(keep_vars=True)]
    elsewhere = {k: sorted(tied.get(k, set()) - set(keys)) for k in keys}
    return {k: others[0] for k, others in elsewhere.items()} if keys and all(elsewhere.values()) else None


class _Inference:
    """One walk over both models: the rules found, the problems left, the layouts measured and what
    was paired by definition order."""

    def __init__(self, tied: dict[str, set[str]]):
        self.tied = tied
        self.rules: list[dict] = []
        self.problems: list[str] = []
        self.measured: list = []
        self.by_order: list[tuple[str, str]] = []  # (torch path, paddle path) paired by definition order

    def walk(self, t_mod, p_layer, t_path: str, p_path: str) -> None:
        family = lookup(t_mod, p_layer)
        pair = self.pair_rules(t_mod, p_layer, t_path, p_path, family)
        if pair is None:
            return
        self.take(pair)
        if family is not None and family.owns_children:
            return
        for t_name, t_child, p_name, p_child in self.children(t_mod, p_layer, t_path, p_path):
            self.walk(t_child, p_child, join(t_path, t_name), join(p_path, p_name))

    def pair_rules(self, t_mod, p_layer, t_path: str, p_path: str, family) -> PortedLayer | None:
        """The rules of one pair's own tensors, their layouts measured; None (a problem said) where
        the paddle layer is not of a type the torch module's family ports to."""
        pair = PortedLayer(t_path, p_path, t_mod, p_layer)
        if family is not None and family.convert is not None:
            if not paddle_type_fits(family, p_layer):
                # a paddle layer that keeps torch's names and shapes (paddle.compat.nn.MultiheadAttention)
                # takes them as they are, whatever the family's paddle types are
                _own_keys_by_name(pair)
                if not pair.problems and _shapes_fit(pair):
                    orient(pair, None)
                    return pair
                self.problems.append(f"torch '{t_path or '<root>'}' is {type(t_mod).__name__} but paddle "
                                     f"'{p_path or '<root>'}' is {type(p_layer).__name__}; expected one of "
                                     f"{', '.join(family.paddle_types)}, or a layer holding torch's tensors under "
                                     "their names and shapes")
                return None
            family.convert(pair)
        else:  # no entry, or a family without weight rules: its own tensors keep their names
            _own_keys_by_name(pair)
        orient(pair, family)
        return pair

    def take(self, pair: PortedLayer) -> None:
        self.rules.extend(pair.rules)
        self.problems.extend(pair.problems)
        self.measured.extend(pair.measured)

    def children(self, t_mod, p_layer, t_path: str, p_path: str) -> list[tuple]:
        """The children of a pair to walk next, paired by name; those left over on both sides, by
        position where as many are left (each holding state), else their layers holding tensors by
        definition order (by_definition_order), else a problem for each."""
        t_children = [(n, c) for n, c in t_mod.named_children() if _has_state(c)]
        p_children = dict(p_layer.named_children())
        paired, t_left = [], []
        for name, child in t_children:
            if name in p_children:
                paired.append((name, child, name, p_children.pop(name)))
            else:
                t_left.append((name, child))
        if not t_left:
            return paired
        # a paddle layer named as a torch module without state holds its own buffers (a rotary table)
        named = {n for n, _ in t_mod.named_children()}
        p_left = [(n, c) for n, c in p_children.items() if c.state_dict() and n not in named]
        if len(p_left) != len(t_left):  # modules whose tensors are all tied to others' need none in paddle
            ties = [_tied_child(child, join(t_path, name), self.tied) for name, child in t_left]
            if all(ties):  # only when nothing else is left over: never a cause to pair the rest by order
                for tie in ties:
                    self.rules.extend({"kind": "drop", "key": k, "comment": f"tied to '{other}' in torch; the paddle "
                                       "port has no such layer (it computes this from that tensor)"}
                                      for k, other in tie.items())
                return paired
        if len(p_left) == len(t_left):
            return paired + [(tn, tc, pn, pc) for (tn, tc), (pn, pc) in zip(t_left, p_left)]
        if not self.by_definition_order(t_left, p_left, t_path, p_path):
            for name, _ in t_left:
                self.problems.append(f"torch module '{join(t_path, name)}' has no paddle sublayer of the same name "
                                     f"under '{p_path or '<root>'}'; name it the same or write the rules by hand")
        return paired

    def by_definition_order(self, t_left: list, p_left: list, t_path: str, p_path: str) -> bool:
        """Pairs the modules holding tensors under the torch children left over with the paddle
        layers holding tensors under the paddle children left over, one to one in definition order
        (paddle.vision renames and nests torchvision's layers): only where there are as many, each
        pair of one family or kind, and every tensor's shape fits its counterpart's. Whether it did."""
        t_held = [(join(t_path, name, sub), m) for name, child in t_left
                  for sub, m in child.named_modules() if torch_own_keys(m)]
        p_held = [(join(p_path, name, sub), layer) for name, child in p_left
                  for sub, layer in child.named_sublayers(include_self=True) if paddle_own_keys(layer)]
        if not t_held or len(t_held) != len(p_held) or any(_tied_child(m, t, self.tied) for t, m in t_held):
            return False
        trial = _Inference(self.tied)
        for (t, module), (p, layer) in zip(t_held, p_held):
            family = lookup(module, layer)
            if family is not None and family.owns_children or kind_of(type(module).__name__) != \
                    kind_of(type(layer).__name__) and (family is None or not paddle_type_fits(family, layer)):
                return False
            pair = trial.pair_rules(module, layer, t, p, family)
            if pair is None or pair.problems or not _shapes_fit(pair):
                return False
            trial.take(pair)
        self.rules.extend(trial.rules)
        self.measured.extend(trial.measured)
        self.by_order.extend((t, p) for (t, _), (p, _) in zip(t_held, p_held))
        return True

    def notes(self) -> list[str]:
        notes = describe(self.measured)
        if self.by_order:
            first = ", ".join(f"'{t}' ~ '{p}'" for t, p in self.by_order[:3])
            notes.append(f"paired {len(self.by_order)} layer(s) holding tensors by definition order, where names "
                         f"differ (each pair of one kind, every shape fitting): {first}"
                         f"{', ...' if len(self.by_order) > 3 else ''}")
        return notes


def _shapes_fit(pair: PortedLayer) -> bool:
    """Whether every tensor a pair's rules rename lands in the shape of its paddle counterpart."""
    torch_state, paddle_state = torch_own(pair.torch_module), paddle_own(pair.paddle_layer)
    turned = {r["key"] for r in pair.rules if r["kind"] == "transpose"}
    reshaped = {r["key"]: tuple(r["shape"]) for r in pair.rules if r["kind"] == "reshape"}
    for rule in pair.rules:
        if rule["kind"] != "rename":
            continue
        t_name, p_name = rule["key"].rpartition(".")[2], rule["to"].rpartition(".")[2]
        if t_name not in torch_state or p_name not in paddle_state:
            return False
        shape = reshaped.get(rule["key"], tuple(torch_state[t_name].shape))
        if tuple(paddle_state[p_name].shape) != (shape[::-1] if rule["key"] in turned else shape):
            return False
    return True


def infer_ruleset(torch_model, paddle_model, *, partial: bool = False) -> RuleSet:
    """The rules that map the torch model's state dict onto the paddle model's, found by walking
    both. Where some cannot be found: a UserError, or (`partial`) the rules found so far with what
    is left listed under `open`, for a user to complete."""
    # each state-dict key whose torch tensor other keys hold too, with those other keys (in any order of registration)
    walk = _Inference({k: set(keys) - {k} for keys in same_tensor_groups(torch_model.state_dict(keep_vars=True).items())
                       for k in keys})
    walk.walk(torch_model, paddle_model, "", "")
    rules, problems = walk.rules, sorted(walk.problems)
    if problems and not partial:
        raise UserError(f"cannot infer a mapping from the two models ({len(problems)} problem(s)); "
                        "fix the port or pass --mapping:", problems)
    # keys that name the same paddle tensor as an earlier key, under that earlier key
    aliases = {keys[0]: keys[1:] for keys in same_tensor_groups(paddle_model.state_dict().items())}
    for rule in rules:
        if rule["kind"] == "rename" and rule["to"] in aliases:
            rule["aliases"] = aliases[rule["to"]]
    description = ("Inferred from the torch and paddle models by module type, each 2-D weight's layout "
                   "measured. Review it, edit it, and pass it back with --mapping.")
    ruleset = parse_ruleset({"name": "inferred", "description": description, "rules": rules}, "inferred")
    return replace(ruleset, notes=tuple(walk.notes()), open=tuple(problems))
