"""converter.paths: dotted module paths, the model being the empty path."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from converter import paths

part = st.sampled_from(["a", "b", "ab", "0", "1", "layer"])
path = st.lists(part, max_size=4).map(".".join)


def test_is_under():
    assert paths.is_under("a.b", "a") and paths.is_under("a.b", "") and paths.is_under("a.b", "a.b")
    assert paths.is_under("", "")
    assert not paths.is_under("a.bc", "a.b") and not paths.is_under("a", "a.b") and not paths.is_under("", "a")
    assert paths.is_inside("a.b", "a") and not paths.is_inside("a", "a") and not paths.is_inside("", "")


def test_parent_name_join_relative_depth():
    assert (paths.parent("a.b.c"), paths.parent("a"), paths.parent("")) == ("a.b", "", "")
    assert (paths.name("a.b.c"), paths.name("a"), paths.name("")) == ("c", "a", "")
    assert paths.join("", "a", "", "b.c") == "a.b.c" and paths.join("", "") == ""
    assert paths.relative("a.b.c", "a") == "b.c" and paths.relative("a.b", "") == "a.b"
    assert paths.relative("a", "a") == "" and paths.relative("ab", "a") is None
    assert (paths.depth(""), paths.depth("a"), paths.depth("a.b")) == (0, 1, 2)


def test_common_parent_and_prefixes():
    assert paths.common_parent(["a.b.c", "a.b.d", "a.b"]) == "a.b"
    assert paths.common_parent(["a.b", "ab.c"]) == "" and paths.common_parent([]) == ""
    assert paths.common_parent(["x.y"]) == "x.y"
    assert paths.prefixes("a.b") == ["", "a", "a.b"] and paths.prefixes("") == [""]


@given(path, path)
@pytest.mark.slow
def test_joined_is_under_and_relative_gives_it_back(parent, child):
    joined = paths.join(parent, child)
    assert paths.is_under(joined, parent)
    assert paths.relative(joined, parent) == child
    assert paths.depth(joined) == paths.depth(parent) + paths.depth(child)


@given(path, path)
@pytest.mark.slow
def test_is_under_is_being_a_prefix_by_parts(p, q):
    assert paths.is_under(p, q) == (q in paths.prefixes(p))


@given(st.lists(path, min_size=1, max_size=5))
@pytest.mark.slow
def test_common_parent_is_the_deepest_shared_prefix(ps):
    common = paths.common_parent(ps)
    assert all(paths.is_under(p, common) for p in ps)
    deeper = [q for q in paths.prefixes(ps[0]) if paths.depth(q) == paths.depth(common) + 1]
    assert not any(all(paths.is_under(p, q) for p in ps) for q in deeper)


@given(path)
@pytest.mark.slow
def test_parent_and_name_rebuild_the_path(p):
    assert paths.join(paths.parent(p), paths.name(p)) == p
    assert p == "" or paths.depth(paths.parent(p)) == paths.depth(p) - 1
