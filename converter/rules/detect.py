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


def installed_target() -> str | None:
    """The library to write for when no --target is given: the one of PaddleFormers and PaddleNLP
    that is installed here, or None where both or neither are (found without importing either)."""
    import importlib.util
    installed = [t for t in TARGETS if importlib.util.find_spec(t) is not None]
    return installed[0] if len(installed) == 1 else None


def default_target(has: dict[str, bool]) -> str:
    """The library to write for without --target, given which libraries have what is converted
    (`has`: library -> bool): the installed one where it has it; else PaddleFormers where it has
    it, else PaddleNLP."""
    installed = installed_target()
    if installed is not None and has.get(installed):
        return installed
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

    other_target: list[str] = field(default_factory=list)  # the other library's sets that fit too

    def describe(self, keys: int) -> str:
        target = target_of(self.chosen.name)
        line = f"mapping: detected '{self.chosen.name}' for {LIBRARIES[target]} (maps all {keys} keys"
        if self.same_file:
            line += f"; {_quoted(self.same_file)} give{'s' if len(self.same_file) == 1 else ''} the same file"
        line += ")"
        if self.also_fit:
            s = "s" if len(self.also_fit) == 1 else ""
            line += f"; {_quoted(self.also_fit)} also fit{s} but write{s} other names: pass --mapping NAME to choose"
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
        raise _none_fits(min(tried, key=_closeness), len(infos), preferred, [t.name for t in fitting])
    chosen = ours[0]
    same = [t.name for t in ours[1:] if _signature(t.plan) == _signature(chosen.plan)]
    other = [t.name for t in ours[1:] if t.name not in same]
    elsewhere = [t.name for t in fitting if target_of(t.name) != preferred]
    return Detection(chosen, sorted(same), sorted(other), sorted(elsewhere))


def _none_fits(closest: Trial, keys: int, target: str, elsewhere: list[str]) -> UserError:
    if elsewhere:
        other = PADDLENLP if target == PADDLEFORMERS else PADDLEFORMERS
        return UserError(f"no shipped mapping for {LIBRARIES[target]} fits this checkpoint; {_quoted(elsewhere)} for "
                         f"{LIBRARIES[other]} does{'' if len(elsewhere) == 1 else ' (each)'}: pass --target {other}, "
                         "or --mapping FILE with rules of your own")
    instead = ("pass --mapping FILE with rules for them (start from the closest set's file, or give it "
               "\"unmatched\": \"keep\"), or --spec FILE to infer the rules from the two models")
    if closest.unmapped:
        shown = ", ".join(closest.unmapped[:SHOWN]) + (", ..." if len(closest.unmapped) > SHOWN else "")
        return UserError(f"no shipped mapping fits this checkpoint: the closest, '{closest.name}', leaves "
                         f"{len(closest.unmapped)} of {keys} keys unmapped ({shown}); {instead}")
    return UserError(f"no shipped mapping fits this checkpoint: the closest, '{closest.name}', names every key "
                     f"but its plan has {len(closest.problems)} problem(s); pass --mapping FILE, or --spec FILE",
                     closest.problems[:SHOWN])
