"""Pair torch module paths with paddle layer paths.

In order of trust: the same path on both sides; the mapping (the paddle layers
that receive a torch module's weights, up to their common ancestor); and for
layers without weights, the same kind of layer in execution order under the
same paired parent. A layer that exists on one side only stays unpaired and is
compared at its nearest paired ancestor.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATIONS = {"relu", "relu6", "gelu", "silu", "swish", "hardswish", "hardsigmoid", "leakyrelu", "elu",
               "selu", "celu", "mish", "tanh", "sigmoid", "softplus", "hardtanh", "prelu", "quickgelu"}
DROPOUTS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alphadropout"}


def kind_of(type_name: str) -> str:
    """A type's family for pairing: activations pair with activations, so a ReLU ported as
    ReLU6 is paired, compared and diagnosed rather than lost."""
    t = type_name.lower()
    if t in ACTIVATIONS:
        return "activation"
    if t in DROPOUTS:
        return "dropout"
    return t


@dataclass(frozen=True)
class LayerPair:
    torch: str
    paddle: str
    torch_type: str
    paddle_type: str


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def _common_ancestor(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths]
    common = []
    for items in zip(*parts):
        if len(set(items)) != 1:
            break
        common.append(items[0])
    return ".".join(common)


def _targets_by_module(ruleset) -> dict[str, set[str]]:
    """torch module path -> paddle layer paths that receive its weights, from literal key rules."""
    out: dict[str, set[str]] = {}
    for rule in ruleset.rules if ruleset is not None else ():
        key = rule.spec.get("key")
        if not isinstance(key, str) or rule.kind not in ("rename", "split"):
            continue
        targets = rule.spec["to"] if isinstance(rule.spec["to"], list) else [rule.spec["to"]]
        out.setdefault(_parent(key), set()).update(_parent(t) for t in targets)
    return out


def align(torch_calls: dict, paddle_calls: dict, ruleset=None) -> list[LayerPair]:
    """Pairs in torch completion order. `*_calls` map path -> Call (with .type and .end)."""
    pairs: dict[str, str] = {}
    used: set[str] = set()

    def add(t, p):
        if t not in pairs and p not in used and p in paddle_calls:
            pairs[t] = p
            used.add(p)

    for path in torch_calls:
        if path in paddle_calls:
            add(path, path)
    # weights: a torch module pairs with the common ancestor of the paddle layers that receive
    # the weights of its subtree; outer modules first, so a wrapper does not steal its parent's pair
    own = _targets_by_module(ruleset)
    for t in sorted(torch_calls, key=lambda p: (p.count("."), p) if p else (-1, p)):
        if t in pairs:
            continue
        targets = set()
        for module, paddle_paths in own.items():
            if module == t or module.startswith(t + ".") or t == "":
                targets |= paddle_paths
        if targets:
            add(t, _common_ancestor(sorted(targets)))
    # layers without weights: same family, execution order, under the same paired ancestor
    def paired_ancestor(path, paired):
        """The nearest ancestor of `path` in `paired`, or None."""
        while path:
            path = _parent(path)
            if path in paired:
                return path
        return None

    groups_t: dict[tuple, list[str]] = {}
    groups_p: dict[tuple, list[str]] = {}
    for t, call in sorted(torch_calls.items(), key=lambda kv: kv[1].end):
        if t not in pairs:
            above = paired_ancestor(t, pairs)
            groups_t.setdefault((pairs.get(above), kind_of(call.type)), []).append(t)
    for p, call in sorted(paddle_calls.items(), key=lambda kv: kv[1].end):
        if p not in used:
            groups_p.setdefault((paired_ancestor(p, used), kind_of(call.type)), []).append(p)
    for key, t_list in groups_t.items():
        p_list = groups_p.get(key, [])
        if key[0] is not None and len(t_list) == len(p_list):
            for t, p in zip(t_list, p_list):
                add(t, p)
    ordered = sorted(pairs.items(), key=lambda kv: torch_calls[kv[0]].end)
    return [LayerPair(t, p, torch_calls[t].type, paddle_calls[p].type) for t, p in ordered]
