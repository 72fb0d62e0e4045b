"""The search for the first unit over budget, over plain probes (index -> bad) and no model: the
bisection where badness persists, the candidates in order where it does not, and the look back
from a unit over budget past the units a clean probe does not read (search.py)."""

import math

import pytest

from converter.verify.search import first_bad_in_order, first_bad_unit, look_back


def _probe(bad: list[bool], probed: dict | None = None):
    """A probe over `bad`, recording each index it is asked for (index -> bad) in `probed`, in order."""
    probed = {} if probed is None else probed

    def probe(i: int) -> bool:
        assert i not in probed, f"unit {i} probed twice"
        probed[i] = bad[i]
        return bad[i]
    return probe, probed


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
def test_a_persisting_badness_is_found_at_its_first_unit_in_log2_probes(n):
    for first in range(n + 1):  # first == n: none bad
        probe, probed = _probe([i >= first for i in range(n)])
        assert first_bad_unit(n, probe) == (first if first < n else None)
        assert len(probed) <= math.ceil(math.log2(n + 1))


def test_the_first_unit_bad_and_the_last_alone_bad_and_none():
    probe, probed = _probe([True] * 5)
    assert first_bad_unit(5, probe) == 0 and list(probed) == [2, 1, 0]
    probe, probed = _probe([False] * 4 + [True])
    assert first_bad_unit(5, probe) == 4 and list(probed) == [2, 4, 3]
    probe, probed = _probe([False] * 5)
    assert first_bad_unit(5, probe) is None and list(probed) == [2, 4]  # the last unit (the model) is probed
    probe, probed = _probe([])
    assert first_bad_unit(0, probe) is None and probed == {}


def test_a_badness_that_does_not_persist_gives_a_unit_bad_after_a_clean_one():
    """Where the probes are not monotone the bisection still ends on a unit whose probe is bad and
    whose predecessor's, probed, is clean (or the first unit): not the first bad unit."""
    bad = [False, True, False, False, True, True, False, True]
    probe, probed = _probe(bad)
    found = first_bad_unit(len(bad), probe)
    assert found == 4 and probed[found] and probed[found - 1] is False
    assert list(probed) == [4, 2, 3]
    probe, probed = _probe([False, False, False, True, False])  # bad in the middle, the last clean
    assert first_bad_unit(5, probe) is None and list(probed) == [2, 4]


def test_candidates_in_order_are_probed_until_the_first_bad():
    probe, probed = _probe([False, False, False, True, False, True])
    assert first_bad_in_order([0, 2, 3, 5], probe) == 3 and list(probed) == [0, 2, 3]
    probe, probed = _probe([False, False, False, False, True])
    assert first_bad_in_order([1, 4], probe) == 4 and list(probed) == [1, 4]
    probe, probed = _probe([True])
    assert first_bad_in_order([], probe) is None and probed == {}
    probe, probed = _probe([False, False])
    assert first_bad_in_order(iter([0, 1]), probe) is None and list(probed) == [0, 1]


def test_the_look_back_probes_in_order_the_earlier_units_no_clean_probe_read():
    """Units 0..5; the bisection found 4 with 2 clean. Unit 2 reads unit 1 only, so units 0 and 3
    are probed in order: 0 is bad, and the look back goes on from it (none before it)."""
    bad = [True, False, False, False, True, True]
    probed = {2: False, 4: True}
    probe, _ = _probe(bad, probed)
    reads = {2: {1}}
    assert look_back(4, probed, reads.get, probe) == 0
    assert list(probed) == [2, 4, 0]


def test_a_clean_probe_that_reads_every_earlier_unit_clears_them_all():
    bad = [True, True, False, True]
    probed = {2: False, 3: True}
    probe, _ = _probe(bad, probed)
    assert look_back(3, probed, lambda i: None, probe) == 3  # None: the clean unit 2 read every earlier unit
    assert list(probed) == [2, 3]


def test_the_look_back_keeps_the_found_unit_where_every_earlier_one_is_clean_and_goes_on_from_a_bad_one():
    """Unit 5 found; unit 3 clean and reading nothing earlier: units 0, 1, 2 and 4 are probed in order.
    Unit 2 is bad (a unit that starts over from the model's inputs, as T5's decoder does): from
    it, units 0 and 1 are clean already, so 2 is the answer."""
    bad = [False, False, True, False, False, True]
    probed = {3: False, 5: True}
    probe, _ = _probe(bad, probed)
    assert look_back(5, probed, lambda i: set(), probe) == 2
    assert list(probed) == [3, 5, 0, 1, 2]
    probe, probed = _probe([False, False, True], {2: True})
    assert look_back(2, probed, lambda i: set(), probe) == 2 and list(probed) == [2, 0, 1]
    probe, probed = _probe([True], {0: True})
    assert look_back(0, probed, lambda i: set(), probe) == 0 and list(probed) == [0]
