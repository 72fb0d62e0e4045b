"""The real-model case catalogue is whole: enough bugs over every family, clean pairs with and
without position ids, and a spec file per case that matches the catalogue. Needs neither
transformers nor PaddleNLP."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cases import BUGS, CASES, CLEAN, FAMILIES, spec_text  # noqa: E402
from runner import STRATEGIES  # noqa: E402


def test_each_case_has_its_spec_file():
    on_disk = {f[:-3] for f in os.listdir(os.path.join(HERE, "specs")) if f.endswith(".py")}
    assert on_disk == {case.name for case in CASES}, "run: python tests/real_models/cases.py"
    for case in CASES:
        with open(case.spec_path) as f:
            assert f.read() == spec_text(case), f"{case.spec_path} is stale: run python tests/real_models/cases.py"


def test_catalogue_covers_the_families_and_the_bugs():
    assert len(BUGS) >= 15 and len({c.name for c in CASES}) == len(CASES)
    assert {c.family for c in BUGS if not c.defects} == set(FAMILIES)  # each family has a bug answered right
    for family in FAMILIES.values():  # explicit and default position ids, where the family takes them
        positions = {c.explicit_positions for c in CLEAN if c.family == family.name}
        assert positions == ({True, False} if family.takes_positions else {True})


def test_known_defects_say_what_and_where():
    """A verifier defect a case shows says what it is, and spoils real strategies, one defect per strategy."""
    for case in CASES:
        for defect in case.defects:
            assert len(defect.what) > 40 and defect.strategies and set(defect.strategies) <= set(STRATEGIES), case.name
        spoilt = [s for d in case.defects for s in d.strategies]
        assert len(spoilt) == len(set(spoilt)), case.name
