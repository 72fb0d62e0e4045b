"""Which shipped rule set fits a checkpoint, from its keys and shapes alone.

Every shipped set is tried. A set fits when each key is claimed by one of its naming
rules and the plan builds without a problem (shapes, splits, duplicates). When several
fit, the one that uses more of its own rules is the more specific (a set with head rules,
on a checkpoint with a head, beats one without); sets whose plans write exactly the same
file are not rivals, they are named as giving the same file.

A set may name every key and still not build its plan from the keys alone: its rules name a config
field (a merge by KV-head groups) that a weights file does not hold. Its layout is still known (the
plan built with each such count taken as 1: the same names, shapes and transposes), and it is said
beside the set detected. Where none fits, the closest is the set with the fewest keys and problems
left, then the fewest of its own rules that find no tensor here; a set whose plan lays some tensor
out otherwise (another shape, or a transpose the other lacks) than a set that leaves fewer of its
rules unused is not offered: both cannot be right for this checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UserError
from ..io.base import TensorInfo
from .plan import MappingPlan, build_plan
from .ruleset import RuleIndex, RuleSet, resolve_mapping, shipped_mappings

SHOWN = 5  # unmapped keys named in the message when nothing fits

PADDLEFORMERS, PADDLENLP = "paddleformers", "paddlenlp"
TARGETS = (PADDLEFORMERS, PADDLENLP)
LIBRARIES = {PADDLEFORMERS: "PaddleFormers 1.2", PADDLENLP: "PaddleNLP 2.8.1"}
PREFIX = PADDLEFORMERS + "-"  # a PaddleFormers set's name: paddleformers-FAMILY


def target_of(name: str) -> str:
    """The library a shipped set's name says it targets."""
    return PADDLEFORMERS if name.startswith(PREFIX) else PADDLENLP


def check_target(target: str | None) -> str | None:
    if target is not None and target not in TARGETS:
        raise UserError(f"--target {target!r} is not a library this tool writes for; give paddleformers or paddlenlp")
    return target


def default_target(has: dict[str, bool]) -> str:
    """The library to write for without --target, given which libraries have what is converted
    (`has`: library -> bool): the one of PaddleFormers and PaddleNLP installed here (found without
    importing either) where it alone is and has it; else PaddleFormers where it has it, else PaddleNLP."""
    import importlib.util
    installed = [t for t in TARGETS if importlib.util.find_spec(t) is not None]
    if len(installed) == 1 and has.get(installed[0]):
        return installed[0]
    return PADDLEFORMERS if has.get(PADDLEFORMERS) else PADDLENLP


def shipped_for(target: str) -> list[str]:
    """The shipped sets that target this library."""
    return [n for n in shipped_mappings() if target_of(n) == target]


@dataclass
class Trial:
    """One rule set tried on a checkpoint's keys."""

    ruleset: RuleSet
    unmapped: list[str]
    used_rules: int
    plan: MappingPlan | None = None
    problems: list[str] = field(default_factory=list)
    unused_rules: int = 0  # its naming rules (drops aside) that no key matched
    needs: list[str] = field(default_factory=list)  # config fields its plan needs and was not given
    layout: MappingPlan | None = None  # the plan with each needed count taken as 1 (names, shapes, transposes)

    @property
    def name(self) -> str:
        return self.ruleset.name

    @property
    def fits(self) -> bool:
        return self.plan is not None

    @property
    def laid_out(self) -> MappingPlan | None:
        """Its plan, or where only config fields are missing, the plan with each taken as 1."""
        return self.plan if self.plan is not None else self.layout


@dataclass
class Detection:
    chosen: Trial
    same_file: list[str]  # other sets that write exactly the same file
    also_fit: list[str]  # other sets that fit but write something else

    other_target: list[str] = field(default_factory=list)  # the other library's sets that fit too
    # sets of the same library that name every key too but need config fields: (names writing one
    # file, the fields), one per file they would write
    with_config: list[tuple[list[str], list[str]]] = field(default_factory=list)

    def describe(self, keys: int) -> str:
        target = target_of(self.chosen.name)
        line = f"mapping: detected '{self.chosen.name}' for {LIBRARIES[target]} (maps all {keys} keys"
        if self.same_file:
            line += f"; {_quoted(self.same_file)} give{'s' if len(self.same_file) == 1 else ''} the same file"
        line += ")"
        if self.also_fit:
            s = "s" if len(self.also_fit) == 1 else ""
            line += (f"; {_quoted(self.also_fit)} also fit{s} but write{s} other names: pass --mapping NAME to choose "
                     f"('{self.chosen.name}' is used: it uses the most of its rules here)")
        for names, fields in self.with_config:
            one = len(names) == 1
            line += (f"; {_quoted(names)}{'' if one else ' (one file between them)'} name{'s' if one else ''} every key "
                     f"too, but write{'s' if one else ''} another file and need{'s' if one else ''} the config "
                     f"field{'s' if len(fields) > 1 else ''} {_quoted(fields)}, which the weights alone do not hold "
                     f"('{self.chosen.name}' is used: its plan needs no config field): convert the model directory, "
                     "whose config.json says the family")
        if self.other_target:
            other = PADDLENLP if target == PADDLEFORMERS else PADDLEFORMERS
            line += f"; for {LIBRARIES[other]} ({_quoted(self.other_target)}) pass --target {other}"
        return line


def _quoted(names: list[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def try_ruleset(infos: dict[str, TensorInfo], ruleset: RuleSet) -> Trial:
    """The keys `ruleset` leaves unmapped, how many of its rules the keys use, and its plan when it fits."""
    unmapped, used = [], set()
    keeps = ruleset.unmatched == "keep"
    index = RuleIndex(ruleset.rules)
    for key in infos:
        hits = index.matching(key, "naming")
        used.update(rule.where for rule, _ in hits)
        if not hits and not keeps:
            unmapped.append(key)
    unused = sum(1 for rule in ruleset.rules if rule.group == "naming" and rule.kind != "drop" and rule.where not in used)
    trial = Trial(ruleset, sorted(unmapped), len(used), unused_rules=unused)
    if not unmapped:
        try:
            trial.plan = build_plan(infos, ruleset)
        except UserError as exc:
            trial.problems = exc.details or [exc.message]
            trial.needs, trial.layout = _with_counts(infos, ruleset, used)
    return trial


def _with_counts(infos: dict[str, TensorInfo], ruleset: RuleSet, used: set) -> tuple[list[str], MappingPlan | None]:
    """(the config fields the rules that keys matched name as a count and that were not given, the
    plan with each taken as 1), or ([], None) where the plan fails for something else too."""
    needs = sorted({rule.spec[f] for rule in ruleset.rules if rule.where in used for f in ("groups", "count")
                    if isinstance(rule.spec.get(f), str) and rule.spec[f] not in ruleset.params})
    if not needs:
        return [], None
    try:
        return needs, build_plan(infos, ruleset.with_params({**ruleset.params, **{n: 1 for n in needs}}))
    except UserError:
        return [], None


def _signature(plan: MappingPlan) -> tuple:
    """What a plan writes: names, shapes, dtypes and how each is computed from the source."""
    return tuple((e.name, e.aliases, e.shape, e.dtype, tuple(e.parts), e.merge_axis) for e in plan.entries)


def _closeness(trial: Trial) -> tuple:
    return (len(trial.unmapped) + len(trial.problems), trial.unused_rules, -trial.used_rules, trial.name)


def _layouts(plan: MappingPlan, infos: dict[str, TensorInfo]) -> dict[str, tuple]:
    """Per source key, the shape its part of a written tensor has and the transpose that made it."""
    out = {}
    for entry in plan.entries:
        for part in entry.parts:
            shape = tuple(part.reshape or infos[part.source].shape)
            if part.piece is not None:
                axis, start, stop = part.piece
                shape = shape[:axis] + (stop - start,) + shape[axis + 1:]
            if part.perm is not None:
                shape = tuple(shape[i] for i in part.perm)
            out.setdefault(part.source, (shape, part.perm))
    return out


def _conflict(one: Trial, other: Trial, infos: dict[str, TensorInfo]) -> str | None:
    """The first source key the two plans lay out otherwise, said; None where they agree on every key
    both write (or either has no plan)."""
    if one.laid_out is None or other.laid_out is None:
        return None
    mine, theirs = _layouts(one.laid_out, infos), _layouts(other.laid_out, infos)
    for key in sorted(set(mine) & set(theirs)):
        if mine[key] != theirs[key]:
            said = lambda layout: f"{list(layout[0])}{' transposed' if layout[1] else ''}"
            return (f"'{one.name}' names every key too but lays {key!r} out as {said(mine[key])} where '{other.name}' "
                    f"lays it out as {said(theirs[key])}, and {one.unused_rules} of its rules find no tensor here "
                    f"({other.unused_rules} of '{other.name}'s): not offered")
    return None


def closest(trials: list[Trial], infos: dict[str, TensorInfo]) -> tuple[Trial, list[str]]:
    """The trial to offer where none fits, and why closer ones are not: a set whose plan lays some
    tensor out otherwise than a set leaving fewer of its rules unused (both naming every key)."""
    ranked = sorted(trials, key=_closeness)
    passed_over = []
    for trial in ranked:
        rivals = [t for t in ranked if t.unused_rules < trial.unused_rules and not t.unmapped]
        said = next((c for c in (_conflict(trial, t, infos) for t in rivals) if c), None) if not trial.unmapped else None
        if said is None:
            return trial, passed_over
        passed_over.append(said)
    return ranked[0], []


def detect(infos: dict[str, TensorInfo], names: list[str] | None = None, target: str | None = None,
           params: dict | None = None) -> Detection:
    """The shipped rule set that fits these keys; a UserError naming the closest when none does.

    names: the sets to try (default: every shipped set, of `target`'s library when given, else
    PaddleFormers' where one fits). params: config fields a merge by groups may name (a
    config.json beside the weights)."""
    if not infos:
        raise UserError("the checkpoint holds no tensors; there is nothing to convert")
    check_target(target)
    names = names or shipped_mappings()
    trials = [try_ruleset(infos, resolve_mapping(n).with_params(params or {})) for n in names]
    fitting = sorted((t for t in trials if t.fits), key=lambda t: (-t.used_rules, t.name))
    preferred = target or default_target({lib: any(target_of(t.name) == lib for t in fitting) for lib in TARGETS})
    ours = [t for t in fitting if target_of(t.name) == preferred]
    if not ours:
        tried = [t for t in trials if target_of(t.name) == target] if target else trials
        raise _none_fits(*closest(tried, infos), tried, len(infos), preferred, [t.name for t in fitting])
    chosen = ours[0]
    same = [t.name for t in ours[1:] if _signature(t.plan) == _signature(chosen.plan)]
    other = [t.name for t in ours[1:] if t.name not in same]
    elsewhere = [t.name for t in fitting if target_of(t.name) != preferred]
    return Detection(chosen, sorted(same), sorted(other), sorted(elsewhere),
                     _with_config([t for t in trials if t.layout is not None and target_of(t.name) == preferred]))


def _with_config(trials: list[Trial]) -> list[tuple[list[str], list[str]]]:
    """The sets that name every key but need config fields, grouped by the file they would write."""
    groups: dict[tuple, tuple[list[str], set[str]]] = {}
    for t in sorted(trials, key=lambda t: t.name):
        names, fields = groups.setdefault(_signature(t.layout), ([], set()))
        names.append(t.name)
        fields.update(t.needs)
    return [(names, sorted(fields)) for names, fields in groups.values()]


def _none_fits(closest: Trial, passed_over: list[str], others: list[Trial], keys: int, target: str,
               elsewhere: list[str]) -> UserError:
    """No set fits: the closest named (with the sets that would write its file, and those closer that
    are not offered), or the other library's sets that fit."""
    if elsewhere:
        other = PADDLENLP if target == PADDLEFORMERS else PADDLEFORMERS
        return UserError(f"no shipped mapping for {LIBRARIES[target]} fits this checkpoint; {_quoted(elsewhere)} for "
                         f"{LIBRARIES[other]} does{'' if len(elsewhere) == 1 else ' (each)'}: pass --target {other}, "
                         "or --mapping FILE with rules of your own")
    instead = ("pass --mapping FILE with rules for them (start from the closest set's file, or give it "
               "\"unmatched\": \"keep\"), or --spec FILE to infer the rules from the two models")
    same = [t.name for t in others if t is not closest and t.laid_out is not None and closest.laid_out is not None
            and _signature(t.laid_out) == _signature(closest.laid_out)]
    aside = "; ".join(([f"{_quoted(sorted(same))} give{'s' if len(same) == 1 else ''} the same file"] if same else [])
                      + passed_over)
    aside = f" ({aside})" if aside else ""
    if closest.unmapped:
        shown = ", ".join(closest.unmapped[:SHOWN]) + (", ..." if len(closest.unmapped) > SHOWN else "")
        return UserError(f"no shipped mapping fits this checkpoint: the closest, '{closest.name}', leaves "
                         f"{len(closest.unmapped)} of {keys} keys unmapped ({shown}){aside}; {instead}")
    return UserError(f"no shipped mapping fits this checkpoint: the closest, '{closest.name}', names every key "
                     f"but its plan has {len(closest.problems)} problem(s){aside}; pass --mapping FILE, or --spec FILE",
                     closest.problems[:SHOWN])
