"""The data-only unpickler under the readers: what it builds, and every cap it enforces."""

import collections
import pickle

import pytest

from converter.io import unpickle


def _load(data, limits=unpickle.LIMITS, foreign=None):
    resolve = lambda module, name: collections.OrderedDict if (module, name) == ("collections", "OrderedDict") else None
    return unpickle.load(data, resolve, foreign=foreign, limits=limits)[0]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_data_comes_out_as_pickle_makes_it(protocol):
    value = {"a": [1, -2, 2 ** 70, 1.5, None, True], "b": ("x", ()), 3: {"nested": [[], {}]},
             "o": collections.OrderedDict(k=1)}
    if protocol >= 4:  # older protocols spell bytes and frozensets as calls (_codecs.encode, frozenset)
        value |= {"raw": b"raw", "s": frozenset({"p", 4})}
    got = _load(pickle.dumps(value, protocol=protocol))
    if "raw" in got:
        got["raw"] = bytes(got["raw"])
    assert got == value


def test_containers_nested_past_the_cap_are_refused():
    deep = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(unpickle.Refused, match="more than 200 deep"):
        _load(pickle.dumps(deep, protocol=2))
    _load(pickle.dumps(deep, protocol=2), limits=unpickle.Limits(depth=400))


def test_a_list_appended_to_itself_stays_bounded():
    data = b"\x80\x02]q\x00" + b"h\x00a" * 500 + b"."  # l.append(l), 500 times
    with pytest.raises(unpickle.Refused, match="deep"):
        _load(data)


def test_the_memo_is_capped_and_sparse_indexes_cost_nothing():
    many = b"\x80\x02N" + b"".join(b"r" + i.to_bytes(4, "little") for i in range(20)) + b"."
    with pytest.raises(unpickle.Refused, match="memo holds more than 10"):
        _load(many, limits=unpickle.Limits(memo=10))
    assert _load(b"\x80\x02Nr\xf0\xff\xff\xff.") is None  # index 2**32 - 16: one entry


@pytest.mark.parametrize("data,why", [
    (b"\x80\x02}(K\x01K\x02)K\x03u.", "dict key or set item is a tuple"),
    (b"\x80\x02\x8a\xff" + b"\x01" * 255 + b".", "integer of 255 bytes"),
    (b"\x80\x02X\xff\xff\xff\x7fabc.", "ends inside"),
    (b"\x80\x02t.", "MARK"),
    (b"\x80\x02a.", "stack"),
    (b"\x80\x02h\x05.", "never stored"),
    (b"\x80\x02K\x01K\x02.", "unbalanced"),
    (b"\x80\x02N", "before its STOP"),
    (b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.", "asks to import os.system"),
    (b"\x80\x02(cos\nsystem\n" + b"X\x00\x00\x00\x00" * 2 + b"tR.", "asks to import"),
    (b"\x80\x02X\x02\x00\x00\x00\xff\xfe.", "not UTF-8"),
    (b"\x80\x02I01\n.", "data pickles do not use"),
    (b"\x80\x02Q.", "stack"),
    (b"\x80\x02N)\x81.", "calls a NoneType"),
    (b"\x80\x02KxNb.", "state set on a int"),
    (b"\x80\x02ccollections\nOrderedDict\nNb.", "state set on the class"),
])
def test_malformed_and_hostile_pickles_are_refused_with_a_reason(data, why):
    with pytest.raises(unpickle.Refused, match=why):
        _load(data)


def test_foreign_names_are_collected_when_asked_and_nothing_is_called():
    foreign = []
    obj = _load(b"\x80\x02}X\x01\x00\x00\x00kcos\nsystem\nX\x02\x00\x00\x00ls\x85Rs.", foreign=foreign)
    assert foreign == ["os.system"] and isinstance(obj["k"], unpickle.Opaque)
