"""Rule files: JSON data, never code.

A rule file is {"name": ..., "description": ..., "rules": [rule, ...]}. Every
rule names its source keys with `key` (one literal key) or `match` (a regular
expression that must match the whole key; no substring replacement). Rules
fall in four groups, and a source key may be claimed by at most one rule of
each group, so the result never depends on the order of the rules:

  naming  rename {to, aliases?} | split {to: [...], axis, sizes?, groups?} |
          merge {match: [...], to, axis, groups?} | drop |
          stack {match, to, index, count?} | unstack {to: str | [...], index, sizes?, count?}
  layout  transpose {perm?}        (default: reverse the two axes of a 2-D tensor)
  shape   reshape {shape}          (element count must stay the same)
  dtype   cast {dtype}

Per source key the steps run in this order: reshape, split, transpose,
merge, cast. `to` templates use the match groups as \\1 or \\g<name>.

A merge's parts are joined by concatenation, or with `groups: G` interleaved by groups: each
part cut in G equal blocks along the axis, then block 0 of every part, block 1 of every part,
... (PaddleFormers' fused q|k|v with G key/value heads: per KV group, that group's query heads,
then its key head, then its value head). A split with `groups` is its inverse. `stack` puts
the tensors its pattern matches, one per value of the group `index` (0 .. n-1), on a new first
axis; `unstack` takes a stacked tensor's items apart again (its `to` templates name the item's
number as \\g<index>), each item optionally split on its first axis. `groups` and `count` are
numbers, or the name of the config field that holds them (read from a model directory's
config.json where the rule set converts one: RuleSet.with_params).

Patterns are compiled with RE2 (the google-re2 package), whose matching time is linear in
the key's length whatever the pattern: a pattern like `(a+)+b` cannot hang a conversion.
What RE2 does not take (back-references, look-around) is refused with one line. Every field
of every rule is checked for its type and range when the file is read, and every template
against the groups of the patterns it expands.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace

from .. import dtypes
from ..errors import UserError, is_text, one_line, quoted

GROUPS = {"rename": "naming", "split": "naming", "merge": "naming", "drop": "naming", "stack": "naming",
          "unstack": "naming", "transpose": "layout", "reshape": "shape", "cast": "dtype"}
_FIELDS = {
    "rename": ({"to"}, {"aliases"}),
    "split": ({"to", "axis"}, {"sizes", "groups"}),
    "merge": ({"to", "axis"}, {"groups"}),
    "drop": (set(), set()),
    "stack": ({"to", "index"}, {"count"}),
    "unstack": ({"to", "index"}, {"sizes", "count"}),
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


def _re2(literal: bool = False):
    import re2
    options = re2.Options()
    options.log_errors = False  # the error comes back as an exception; RE2 must not print it too
    options.literal = literal
    return re2, options


@dataclass
class Rule:
    kind: str
    patterns: list  # compiled RE2 patterns: one, except for merge (one per part, in order)
    spec: dict
    where: str
    templates: dict = field(default_factory=dict)  # template text -> parsed pieces, of every `to` and alias

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

    def expand(self, match, template: str, extra: dict | None = None) -> str:
        """`template` (a `to` or an alias) with the match's groups filled in, and the names of
        `extra` (an unstack's item number) with their values."""
        extra = extra or {}
        return "".join(p if isinstance(p, str) else extra[p[0]] if p[0] in extra else (match.group(p[0]) or "")
                       for p in self.templates[template])

    def number(self, field_name: str, params: dict):
        """The rule's `groups` or `count`: None when absent, an int, or the reason it has none (a
        str): the config field it names is not known or not a positive integer."""
        value = self.spec.get(field_name)
        if value is None or _is_int(value):
            return value
        if value not in params:
            return (f"{self.where}: '{field_name}' names the config field {quoted(value)}, which is not known here; "
                    "convert the model directory (its config.json holds it) or write the number in the rule")
        found = params[value]
        if not _is_int(found) or found < 1:
            return (f"{self.where}: '{field_name}' names the config field {quoted(value)}, which holds "
                    f"{one_line(json.dumps(found))[:40]}, not a positive integer")
        return found


SET_SIZE = 512  # patterns per RE2 set: one set of 20 000 patterns does not compile within RE2's memory budget
_ANY = "(?s).*"  # a pattern every key matches: a set that names no pattern at all ran out of memory


class _PatternSets:
    """The rules whose `match` patterns fit a key, found with RE2 sets of at most SET_SIZE patterns
    each, a set that does not compile split in halves. Each set also holds a pattern that matches
    everything: when a set names none (RE2 gives up on a search that runs out of memory without
    saying so), every rule of that set is a candidate rather than none."""

    def __init__(self, texts: list[tuple[str, int]]):
        self.sets: list[tuple[object, list[int]]] = []  # (compiled set, rule index per set index)
        self.always: list[int] = []  # rules whose pattern no set takes: tried on every key
        for i in range(0, len(texts), SET_SIZE):
            self._add(texts[i:i + SET_SIZE])

    def _add(self, texts: list[tuple[str, int]]) -> None:
        re2, options = _re2()
        found = re2.Set.FullMatchSet(options)
        try:
            for text, _ in texts:
                found.Add(text)
            found.Add(_ANY)
            found.Compile()
        except re2.error:  # beyond RE2's memory budget for one set: halve it
            if len(texts) == 1:
                self.always.append(texts[0][1])
            else:
                half = len(texts) // 2
                self._add(texts[:half])
                self._add(texts[half:])
            return
        self.sets.append((found, [i for _, i in texts]))

    def candidates(self, key: str) -> set[int]:
        out = set(self.always)
        for found, owners in self.sets:
            named = found.Match(key) or ()
            if len(owners) not in named:  # the catch-all is missing: this set's search failed
                out.update(owners)
            else:
                out.update(owners[k] for k in named if k < len(owners))
        return out


class RuleIndex:
    """The rules of each group that match a key: RE2 sets of the `match` patterns (see
    _PatternSets) and a table of the literal `key`s, per group, so that planning costs about one
    pass over each key per few hundred rules rather than a match of every key against every rule.
    A rule a set names is matched again on its own (for its groups): the sets only narrow the search."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.literals: dict[tuple[str, str], list[int]] = {}  # (group, key) -> rule indexes
        pending: dict[str, list[tuple[str, int]]] = {}
        for i, rule in enumerate(rules):
            for pattern in rule.patterns:
                if pattern.options.literal:
                    self.literals.setdefault((rule.group, pattern.pattern), []).append(i)
                else:
                    pending.setdefault(rule.group, []).append((pattern.pattern, i))
        self.sets = {group: _PatternSets(texts) for group, texts in pending.items()}

    def matching(self, key: str, group: str) -> list[tuple[Rule, tuple]]:
        """(rule, (part index, match)) for every rule of `group` that matches the whole key, in rule order."""
        candidates = set(self.literals.get((group, key), ()))
        if group in self.sets:
            candidates |= self.sets[group].candidates(key)
        hits = []
        for i in sorted(candidates):
            match = self.rules[i].match(key)
            if match is not None:
                hits.append((self.rules[i], match))
        return hits


_TEMPLATE = re.compile(r"\\(?:g<([^<>]*)>|([1-9][0-9]?)|(\\)|(.?))", re.S)


def parse_template(template: str, patterns: list, where: str, extra: tuple = ()) -> list:
    """Literal text (str) and group references ((int or name,)) of a `to` template: \\1 .. \\99,
    \\g<name>, \\g<number>, and \\\\ for a backslash. Every group must exist in every pattern, or be
    one of the `extra` names (an unstack's index)."""
    pieces, last = [], 0
    for m in _TEMPLATE.finditer(template):
        pieces.append(template[last:m.start()])
        last = m.end()
        name, number, backslash, other = m.groups()
        if backslash:
            pieces.append("\\")
            continue
        if other is not None:
            raise UserError(f"{where}: template {quoted(template)} has the escape {quoted(m.group())}; "
                            "use \\1 or \\g<name> for a group and \\\\ for a backslash")
        ref = int(number) if number else int(name) if name.isdigit() else name
        for pattern in patterns if ref not in extra else ():
            known = ref in pattern.groupindex if isinstance(ref, str) else ref <= pattern.groups
            if not known:
                raise UserError(f"{where}: template {quoted(template)} refers to group {quoted(ref)}, which the "
                                f"pattern {quoted(pattern.pattern)} does not have")
        pieces.append((ref,))
    pieces.append(template[last:])
    return [p for p in pieces if p != ""]


@dataclass
class RuleSet:
    name: str
    rules: list[Rule] = field(default_factory=list)
    description: str = ""
    unmatched: str = "error"  # "keep": a key that no naming rule touches keeps its name
    params: dict = field(default_factory=dict)  # config fields that `groups` and `count` may name
    notes: tuple[str, ...] = ()  # what inference measured rather than read from the rules (layouts)
    open: tuple[str, ...] = ()  # what inference could not map: a rule set to complete by hand, not to use

    def with_params(self, params: dict) -> RuleSet:
        """The same rules, with the config fields (a model's config.json) that their `groups` and
        `count` may name."""
        return replace(self, params=dict(params))

    def to_json(self) -> str:
        """One rule per line, so that a reviewer reads it like a table."""
        rules = ",\n".join("  " + json.dumps(r.spec) for r in self.rules)
        keep = ' "unmatched": "keep",\n' if self.unmatched == "keep" else ""
        items = ",\n".join("  " + json.dumps(item) for item in self.open)
        still_open = f' "open": [\n{items}\n ],\n' if self.open else ""
        return (f'{{\n "name": {json.dumps(self.name)},\n "description": {json.dumps(self.description)},\n'
                f'{keep}{still_open} "rules": [\n{rules}\n ]\n}}\n')


def _compile(text, where: str, literal: bool = False):
    """An RE2 pattern that must match the whole key (`literal`: the text itself)."""
    if not isinstance(text, str):
        raise UserError(f"{where}: a pattern must be a string, not {type(text).__name__}")
    re2, options = _re2(literal)
    try:
        return re2.compile(text, options)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise UserError(f"{where}: bad regular expression {quoted(text[:200])} ({one_line(reason)}); patterns "
                        "are matched with RE2, in linear time, which has no back-references or look-around: "
                        "rewrite it without them") from None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise UserError(f"{where}: {what}")


def _strings(value, where: str, field_name: str, least: int = 1) -> list[str]:
    _check(isinstance(value, list) and len(value) >= least and all(isinstance(v, str) for v in value), where,
           f"'{field_name}' must be a list of at least {least} string(s)")
    return value


def _counts(value, where: str, field_name: str) -> list[int]:
    _check(isinstance(value, list) and len(value) <= 64 and all(_is_int(v) and v >= 0 for v in value), where,
           f"'{field_name}' must be a list of at most 64 non-negative integers, not {one_line(json.dumps(value))[:80]}")
    return value


_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def _check_fields(kind: str, spec: dict, where: str) -> None:
    """The type and range of every field a rule of `kind` may have."""
    for name, value in spec.items():
        texts = value if isinstance(value, list) else [value]
        _check(all(is_text(t) for t in texts if isinstance(t, str)), where,
               f"'{name}' is not valid Unicode text (a lone surrogate)")
    if "comment" in spec:
        _check(isinstance(spec["comment"], str), where, "'comment' must be a string")
    if kind in ("rename", "merge"):
        _check(isinstance(spec["to"], str), where, f"{kind} needs 'to' as one target name (a string)")
    if kind == "rename" and "aliases" in spec:
        _strings(spec["aliases"], where, "aliases", least=0)
    if kind == "split":
        _strings(spec["to"], where, "to", least=2)
        if "sizes" in spec:
            _counts(spec["sizes"], where, "sizes")
            _check(len(spec["sizes"]) == len(spec["to"]), where, "split 'sizes' needs one size per target")
    if kind in ("split", "merge"):
        _check(_is_int(spec["axis"]), where, f"'axis' must be an integer, not {one_line(json.dumps(spec['axis']))[:40]}")
    for name in ("groups", "count"):
        if name in spec:
            value = spec[name]
            _check(_is_int(value) and value >= 1 or isinstance(value, str) and _FIELD_NAME.fullmatch(value) is not None,
                   where, f"'{name}' must be a positive integer or the name of a config field (such as "
                   f"\"num_key_value_heads\"), not {one_line(json.dumps(value))[:40]}")
    if kind == "stack":
        _check(isinstance(spec["to"], str), where, "stack needs 'to' as one target name (a string)")
    if kind == "unstack":
        targets = [spec["to"]] if isinstance(spec["to"], str) else _strings(spec["to"], where, "to")
        if "sizes" in spec:
            _counts(spec["sizes"], where, "sizes")
            _check(len(spec["sizes"]) == len(targets), where, "unstack 'sizes' needs one size per target")
    index = spec.get("index")
    name = isinstance(index, str) and _FIELD_NAME.fullmatch(index) is not None
    if kind == "stack":
        _check(_is_int(index) and index >= 1 or name, where, "'index' must be a group of the pattern (a name, or a "
               f"number from 1), not {one_line(json.dumps(index))[:40]}")
    if kind == "unstack":
        _check(name, where, "'index' must be a name that the pattern has no group of (the targets write the item's "
               f"number as \\g<NAME>), not {one_line(json.dumps(index))[:40]}")
    if kind == "transpose" and spec.get("perm") is not None:
        perm = _counts(spec["perm"], where, "perm")
        _check(sorted(perm) == list(range(len(perm))), where, f"'perm' {perm} is not a permutation of 0..{len(perm) - 1}")
    if kind == "reshape":
        _counts(spec["shape"], where, "shape")
    if kind == "cast":
        _check(isinstance(spec["dtype"], str), where, "'dtype' must be a string such as \"float32\"")


def parse_rule(spec: dict, where: str) -> Rule:
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str) or spec["kind"] not in _FIELDS:
        kind = spec.get("kind") if isinstance(spec, dict) else spec
        raise UserError(f"{where}: unknown rule kind {one_line(json.dumps(kind))[:40]}; use one of {', '.join(_FIELDS)}")
    kind = spec["kind"]
    required, optional = _FIELDS[kind]
    unknown = set(spec) - required - optional - _COMMON
    if unknown:
        raise UserError(f"{where}: {kind} rule has unknown field(s) {', '.join(quoted(u) for u in sorted(unknown))}")
    missing = required - set(spec)
    if missing:
        raise UserError(f"{where}: {kind} rule needs field(s) {', '.join(sorted(missing))}")
    if ("key" in spec) == ("match" in spec):
        raise UserError(f"{where}: give exactly one of 'key' (a literal key) or 'match' (a regular expression)")
    _check_fields(kind, spec, where)
    literal = "key" in spec
    texts = spec["key"] if literal else spec["match"]
    if kind == "merge":
        _strings(texts, where, "key" if literal else "match")
    elif kind in ("stack", "unstack") and literal:
        raise UserError(f"{where}: {kind} takes 'match' (a regular expression), not 'key'")
    else:
        _check(isinstance(texts, str), where, f"'{'key' if literal else 'match'}' must be a string")
        texts = [texts]
    patterns = [_compile(t, where, literal) for t in texts]
    if kind == "cast":
        spec = dict(spec, dtype=dtypes.canonical(spec["dtype"]))
    rule = Rule(kind, patterns, spec, where)
    templates = [spec["to"]] if isinstance(spec.get("to"), str) else spec.get("to", [])
    extra = (spec["index"],) if kind == "unstack" else ()
    for template in list(templates) + list(spec.get("aliases", [])):
        rule.templates[template] = parse_template(template, patterns, where, extra)
    if kind in ("stack", "unstack"):
        _check_index(rule, templates)
    return rule


def _check_index(rule: Rule, templates: list) -> None:
    """A stack reads the item's number from a group of its pattern, which its target must not
    name (every item goes into one tensor); an unstack writes it into every target's name (every
    item is a tensor of its own), and its pattern must not have a group of that name."""
    index, pattern = rule.spec["index"], rule.patterns[0]
    named = lambda template: any(p == (index,) for p in rule.templates[template])
    if rule.kind == "stack":
        known = index in pattern.groupindex if isinstance(index, str) else index <= pattern.groups
        _check(known, rule.where, f"'index' {quoted(index)} is not a group of the pattern {quoted(pattern.pattern)}")
        _check(not named(templates[0]), rule.where, f"'to' must not use the index group {quoted(index)}: every "
               "item goes into the one stacked tensor")
    else:
        _check(index not in pattern.groupindex, rule.where, f"'index' must be a name that the pattern has no group "
               f"of (the targets write the item's number as \\g<NAME>), not {quoted(index)}")
        for template in templates:
            _check(named(template), rule.where, f"target {quoted(template)} must use \\g<{index}>, the item's "
                   "number: otherwise every item is written under one name")


def parse_ruleset(body, origin: str) -> RuleSet:
    if not isinstance(body, dict) or not isinstance(body.get("rules"), list):
        raise UserError(f"mapping '{origin}' must be a JSON object with a 'rules' list")
    if len(body["rules"]) > MAX_RULES:
        raise UserError(f"mapping {quoted(origin)} has {len(body['rules'])} rules, more than the {MAX_RULES} a rule file "
                        "may hold; match many keys with one pattern (e.g. layer\\.(\\d+)\\.weight) instead of a rule per key")
    still_open = body.get("open") or []
    if still_open:
        first = one_line(str(still_open[0]) if isinstance(still_open, list) else str(still_open))[:160]
        count = len(still_open) if isinstance(still_open, list) else 1
        raise UserError(f"mapping {quoted(origin)} still lists {count} open item(s) under 'open' (the first: {first}); "
                        "add a rule for each (rename, transpose or drop), then delete the 'open' list")
    rules = [parse_rule(spec, f"{origin} rule {i + 1}") for i, spec in enumerate(body["rules"])]
    unmatched = body.get("unmatched", "error")
    if unmatched not in UNMATCHED:
        raise UserError(f"mapping '{origin}': 'unmatched' must be \"error\" (the default: every key needs a rule) or "
                        f"\"keep\" (keys no naming rule touches keep their names), not {json.dumps(unmatched)}")
    for key in ("name", "description"):
        if not isinstance(body.get(key, ""), str):
            raise UserError(f"mapping {quoted(origin)}: '{key}' must be a string, not "
                            f"{one_line(json.dumps(body[key]))[:40]}")
    return RuleSet(body.get("name", os.path.basename(origin)), rules, body.get("description", ""), unmatched)


UNMATCHED = ("error", "keep")
MAX_RULES = 50_000  # reading a rule costs about 0.1 ms (its patterns compiled, its templates checked)


def load_ruleset(path: str) -> RuleSet:
    from ..io.inputs import RULE_FILE_CAP, read_small_file
    raw = read_small_file(path, "mapping file", RULE_FILE_CAP)
    try:
        body = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"mapping file {quoted(path)} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UserError(f"mapping file {quoted(path)} is not valid JSON: nested too deeply") from None
    return parse_ruleset(body, path)


def shipped_mappings() -> list[str]:
    if not os.path.isdir(MAPPINGS_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(MAPPINGS_DIR) if f.endswith(".json"))


def looks_like_path(value: str) -> bool:
    """A --mapping value names a file only when it looks like a path: it holds a directory
    separator or ends in .json. Otherwise it is a shipped set's name, whatever the current
    directory holds (a folder named `llama` there does not hide the shipped `llama`)."""
    return os.path.sep in value or (os.path.altsep or os.path.sep) in value or value.endswith(".json")


def resolve_mapping(name: str) -> RuleSet:
    """A rule file by path when the value looks like one (looks_like_path), else the shipped rule set
    of that name (see mappings/)."""
    if looks_like_path(name):
        return load_ruleset(name)
    path = os.path.join(MAPPINGS_DIR, name + ".json")
    if not os.path.isfile(path):
        local = (f"; to read the file {quoted(name)} in the current directory, give it as "
                 f"{quoted(os.path.join(os.curdir, name))}" if os.path.isfile(name) else "")
        raise UserError(f"unknown mapping {quoted(name)}; shipped mappings are: "
                        f"{', '.join(shipped_mappings()) or 'none'}, or give the path of a rule file{local}")
    return load_ruleset(path)
