"""Which shipped rule set fits a checkpoint, from its keys and shapes alone.

Every shipped set is tried. A set fits when each key is claimed by one of its naming
rules and the plan builds without a problem (shapes, splits, duplicates). When several
fit, the one that uses more of its own rules is the more specific (a set with head rules,
on a checkpoint with a head, beats one without); sets whose plans write exactly the same
file are not rivals, they are named as giving the same file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UserError
from ..io.base import TensorInfo
from .plan import MappingPlan, build_plan
from .ruleset import RuleIndex, RuleSet, resolve_mapping, shipped_mappings

SHOWN = 5  # unmapped keys named in the message when nothing fits


@dataclass
class Trial:
    """One rule set tried on a checkpoint's keys."""

    ruleset: RuleSet
    unmapped: list[str]
    used_rules: int
    plan: MappingPlan | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.ruleset.name

    @property
    def fits(self) -> bool:
        return self.plan is not None


@dataclass
class Detection:
    chosen: Trial
    same_file: list[str]  # other sets that write exactly the same file
    also_fit: list[str]  # other sets that fit but write something else

    def describe(self, keys: int) -> str:
        line = f"mapping: detected '{self.chosen.name}' (maps all {keys} keys"
        if self.same_file:
            line += f"; {_quoted(self.same_file)} give{'s' if len(self.same_file) == 1 else ''} the same file"
        line += ")"
        if self.also_fit:
            s = "s" if len(self.also_fit) == 1 else ""
            line += f"; {_quoted(self.also_fit)} also fit{s} but write{s} other names: pass --mapping NAME to choose"
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
    trial = Trial(ruleset, sorted(unmapped), len(used))
    if not unmapped:
        try:
            trial.plan = build_plan(infos, ruleset)
        except UserError as exc:
            trial.problems = exc.details or [exc.message]
    return trial


def _signature(plan: MappingPlan) -> tuple:
    """What a plan writes: names, shapes, dtypes and how each is computed from the source."""
    return tuple((e.name, e.aliases, e.shape, e.dtype, tuple(e.parts), e.merge_axis) for e in plan.entries)


def _closeness(trial: Trial) -> tuple:
    return (len(trial.unmapped) + len(trial.problems), -trial.used_rules, trial.name)


def detect(infos: dict[str, TensorInfo], names: list[str] | None = None) -> Detection:
    """The shipped rule set that fits these keys; a UserError naming the closest when none does."""
    if not infos:
        raise UserError("the checkpoint holds no tensors; there is nothing to convert")
    trials = [try_ruleset(infos, resolve_mapping(n)) for n in (names or shipped_mappings())]
    fitting = sorted((t for t in trials if t.fits), key=lambda t: (-t.used_rules, t.name))
    if not fitting:
        raise _none_fits(min(trials, key=_closeness), len(infos))
    chosen = fitting[0]
    same = [t.name for t in fitting[1:] if _signature(t.plan) == _signature(chosen.plan)]
    other = [t.name for t in fitting[1:] if t.name not in same]
    return Detection(chosen, sorted(same), sorted(other))


def _none_fits(closest: Trial, keys: int) -> UserError:
    instead = ("pass --mapping FILE with rules for them (start from the closest set's file, or give it "
               "\"unmatched\": \"keep\"), or --spec FILE to infer the rules from the two models")
    if closest.unmapped:
        shown = ", ".join(closest.unmapped[:SHOWN]) + (", ..." if len(closest.unmapped) > SHOWN else "")
        return UserError(f"no shipped mapping fits this checkpoint: the closest, '{closest.name}', leaves "
                         f"{len(closest.unmapped)} of {keys} keys unmapped ({shown}); {instead}")
    return UserError(f"no shipped mapping fits this checkpoint: the closest, '{closest.name}', names every key "
                     f"but its plan has {len(closest.problems)} problem(s); pass --mapping FILE, or --spec FILE",
                     closest.problems[:SHOWN])
