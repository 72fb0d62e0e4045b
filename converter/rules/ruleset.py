"""Rule files: JSON data, never code.

A rule file is {"name": ..., "description": ..., "rules": [rule, ...]}. Every
rule names its source keys with `key` (one literal key) or `match` (a regular
expression that must match the whole key; no substring replacement). Rules
fall in four groups, and a source key may be claimed by at most one rule of
each group, so the result never depends on the order of the rules:

  naming  rename {to, aliases?} | split {to: [...], axis, sizes?} |
          merge {match: [...], to, axis} | drop
  layout  transpose {perm?}        (default: reverse the two axes of a 2-D tensor)
  shape   reshape {shape}          (element count must stay the same)
  dtype   cast {dtype}

Per source key the steps run in this order: reshape, split, transpose,
merge, cast. `to` templates use the match groups as \\1 or \\g<name>.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from .. import dtypes
from ..errors import UserError

GROUPS = {"rename": "naming", "split": "naming", "merge": "naming", "drop": "naming",
          "transpose": "layout", "reshape": "shape", "cast": "dtype"}
_FIELDS = {
    "rename": ({"to"}, {"aliases"}),
    "split": ({"to", "axis"}, {"sizes"}),
    "merge": ({"to", "axis"}, set()),
    "drop": (set(), set()),
    "transpose": (set(), {"perm"}),
    "reshape": ({"shape"}, set()),
    "cast": ({"dtype"}, set()),
}
_COMMON = {"kind", "key", "match", "comment"}


def _mappings_dir() -> str:
    """mappings/ is installed as the data package `converter.mappings`; in a checkout it sits at the top."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("converter.mappings")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if os.path.isdir(location):
                return location
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "mappings")


MAPPINGS_DIR = _mappings_dir()


@dataclass
class Rule:
    kind: str
    patterns: list[re.Pattern]  # one, except for merge (one per part, in order)
    spec: dict
    where: str

    @property
    def group(self) -> str:
        return GROUPS[self.kind]

    def match(self, key: str):
        """(part index, match) of the first pattern matching the whole key, or None."""
        for i, pattern in enumerate(self.patterns):
            m = pattern.fullmatch(key)
            if m:
                return i, m
        return None


@dataclass
class RuleSet:
    name: str
    rules: list[Rule] = field(default_factory=list)
    description: str = ""
    unmatched: str = "error"  # "keep": a key that no naming rule touches keeps its name

    def to_json(self) -> str:
        """One rule per line, so that a reviewer reads it like a table."""
        rules = ",\n".join("  " + json.dumps(r.spec) for r in self.rules)
        keep = ' "unmatched": "keep",\n' if self.unmatched == "keep" else ""
        return (f'{{\n "name": {json.dumps(self.name)},\n "description": {json.dumps(self.description)},\n'
                f'{keep} "rules": [\n{rules}\n ]\n}}\n')


def _compile(text, where: str) -> re.Pattern:
    if not isinstance(text, str):
        raise UserError(f"{where}: 'match' must be a string regular expression")
    try:
        return re.compile(text)
    except re.error as exc:
        raise UserError(f"{where}: bad regular expression {text!r}: {exc}") from None


def parse_rule(spec: dict, where: str) -> Rule:
    if not isinstance(spec, dict) or spec.get("kind") not in _FIELDS:
        kind = spec.get("kind") if isinstance(spec, dict) else spec
        raise UserError(f"{where}: unknown rule kind {kind!r}; use one of {', '.join(_FIELDS)}")
    kind = spec["kind"]
    required, optional = _FIELDS[kind]
    unknown = set(spec) - required - optional - _COMMON
    if unknown:
        raise UserError(f"{where}: {kind} rule has unknown field(s) {', '.join(sorted(unknown))}")
    missing = required - set(spec)
    if missing:
        raise UserError(f"{where}: {kind} rule needs field(s) {', '.join(sorted(missing))}")
    if ("key" in spec) == ("match" in spec):
        raise UserError(f"{where}: give exactly one of 'key' (a literal key) or 'match' (a regular expression)")
    if "key" in spec:
        keys = spec["key"] if kind == "merge" else [spec["key"]]
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise UserError(f"{where}: 'key' must be a string (a list of strings for merge)")
        patterns = [re.compile(re.escape(k)) for k in keys]
    else:
        texts = spec["match"] if kind == "merge" else [spec["match"]]
        if not isinstance(texts, list) or not texts:
            raise UserError(f"{where}: merge needs 'match' as a list of patterns, one per part")
        patterns = [_compile(t, where) for t in texts]
    if kind == "split" and (not isinstance(spec["to"], list) or len(spec["to"]) < 2):
        raise UserError(f"{where}: split needs 'to' as a list of at least two target names")
    if kind == "split" and "sizes" in spec and len(spec["sizes"]) != len(spec["to"]):
        raise UserError(f"{where}: split 'sizes' needs one size per target")
    if kind in ("rename", "merge") and not isinstance(spec["to"], str):
        raise UserError(f"{where}: {kind} needs 'to' as one target name")
    if kind == "cast":
        spec = dict(spec, dtype=dtypes.canonical(spec["dtype"]))
    return Rule(kind, patterns, spec, where)


def parse_ruleset(body, origin: str) -> RuleSet:
    if not isinstance(body, dict) or not isinstance(body.get("rules"), list):
        raise UserError(f"mapping '{origin}' must be a JSON object with a 'rules' list")
    rules = [parse_rule(spec, f"{origin} rule {i + 1}") for i, spec in enumerate(body["rules"])]
    unmatched = body.get("unmatched", "error")
    if unmatched not in UNMATCHED:
        raise UserError(f"mapping '{origin}': 'unmatched' must be \"error\" (the default: every key needs a rule) or "
                        f"\"keep\" (keys no naming rule touches keep their names), not {json.dumps(unmatched)}")
    return RuleSet(str(body.get("name", os.path.basename(origin))), rules, str(body.get("description", "")), unmatched)


UNMATCHED = ("error", "keep")


def load_ruleset(path: str) -> RuleSet:
    try:
        with open(path, encoding="utf-8") as f:
            body = json.load(f)
    except FileNotFoundError:
        raise UserError(f"mapping file '{path}' does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"mapping file '{path}' is not valid JSON: {exc}") from None
    return parse_ruleset(body, path)


def shipped_mappings() -> list[str]:
    if not os.path.isdir(MAPPINGS_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(MAPPINGS_DIR) if f.endswith(".json"))


def resolve_mapping(name_or_path: str) -> RuleSet:
    """A shipped rule set by name (see mappings/), or a rule file by path."""
    if os.path.sep in name_or_path or name_or_path.endswith(".json") or os.path.exists(name_or_path):
        return load_ruleset(name_or_path)
    path = os.path.join(MAPPINGS_DIR, name_or_path + ".json")
    if not os.path.isfile(path):
        raise UserError(f"unknown mapping '{name_or_path}'; shipped mappings are: "
                        f"{', '.join(shipped_mappings()) or 'none'}, or give the path of a rule file")
    return load_ruleset(path)
