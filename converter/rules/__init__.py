"""Mapping rules as data, and the plan that applies them."""

from .ruleset import RuleSet, load_ruleset, resolve_mapping
from .plan import MappingPlan, build_plan

__all__ = ["RuleSet", "load_ruleset", "resolve_mapping", "MappingPlan", "build_plan"]
