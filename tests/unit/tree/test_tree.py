"""converter.tree: one walk over nested values (dict, list, tuple, namedtuple, dataclass, a
ModelOutput) and one rule for the leaves verification compares, on real torch and paddle tensors."""

import dataclasses
from collections import OrderedDict, namedtuple

import numpy as np
import paddle
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from converter import tree
from converter.frameworks import paddle_side, torch_side


class ModelOutput(OrderedDict):
    """As transformers' ModelOutput: an OrderedDict and a dataclass at once, whose keys are the
    fields that are set, kept in step with its attributes."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is not None:
                self[f.name] = getattr(self, f.name)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __setattr__(self, key, value):
        if key in self.keys() and value is not None:
            super().__setitem__(key, value)
        super().__setattr__(key, value)


@dataclasses.dataclass
class CausalOutput(ModelOutput):
    loss: object = None
    logits: object = None
    hidden_states: object = None


@dataclasses.dataclass
class Pair:
    first: object
    second: object
    note: str = "kept"


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: object
    count: int = dataclasses.field(default=0, init=False)


Point = namedtuple("Point", "x y")

is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)


# the containers ------------------------------------------------------------------------------

def test_flatten_order_over_every_container():
    value = {"a": [1, (2, 3)], "b": Point(4, {"c": 5}), "d": Pair(6, [7]), "e": "text", "f": None}
    assert tree.flatten(value, is_int) == [1, 2, 3, 4, 5, 6, 7]


def test_replace_keeps_every_container_type():
    value = {"a": [1, (2, 3)], "b": Point(4, OrderedDict(c=5)), "d": Pair(6, [7], note="n")}
    out = tree.replace(value, [v * 10 for v in tree.flatten(value, is_int)], is_int)
    assert out == {"a": [10, (20, 30)], "b": Point(40, OrderedDict(c=50)), "d": Pair(60, [70], note="n")}
    assert type(out["b"]) is Point and type(out["b"].y) is OrderedDict and type(out["d"]) is Pair
    assert value["a"] == [1, (2, 3)] and value["d"].first == 6  # the input is not changed


def test_replace_by_index_keeps_the_rest():
    assert tree.replace((1, [2, 3], {"k": 4}), {1: "two", 3: "four"}, is_int) == (1, ["two", 3], {"k": "four"})


def test_replace_refuses_a_wrong_count():
    with pytest.raises(ValueError, match="2 replacements for 3 leaves"):
        tree.replace([1, 2, 3], ["a", "b"], is_int)


def test_model_output_keeps_its_type_keys_and_attributes():
    out = CausalOutput(logits=torch.ones(2), hidden_states=(torch.zeros(1), torch.full((1,), 2.0)))
    assert list(out.keys()) == ["logits", "hidden_states"]  # loss is None: no key
    leaves = tree.flatten(out, tree.is_float_tensor)
    assert [t.tolist() for t in leaves] == [[1.0, 1.0], [0.0], [2.0]]
    new = tree.map_leaves(out, lambda t: t * 3)
    assert type(new) is CausalOutput and list(new.keys()) == ["logits", "hidden_states"]
    assert new.logits.tolist() == [3.0, 3.0] and new["hidden_states"][1].tolist() == [6.0]
    assert new.loss is None and isinstance(new, OrderedDict) and dataclasses.is_dataclass(new)
    assert out.logits.tolist() == [1.0, 1.0]


def test_frozen_dataclass_and_init_false_field():
    value = Frozen(torch.ones(1))
    object.__setattr__(value, "count", 5)
    new = tree.map_leaves(value, lambda t: t + 1)
    assert type(new) is Frozen and new.value.tolist() == [2.0] and new.count == 5 and value.value.tolist() == [1.0]


def test_a_container_with_nothing_changed_is_the_same_object():
    inner = {"ids": torch.arange(3)}  # integer tensors are no leaves of the float rule
    value = (inner, [torch.ones(1)])
    new = tree.map_leaves(value, lambda t: t * 2)
    assert new[0] is inner and new[1] is not value[1]


def test_a_container_holding_itself_is_walked_once():
    loop = [1]
    loop.append(loop)
    assert tree.flatten(loop, is_int) == [1]
    out = tree.map_leaves(loop, lambda v: v + 1, is_int)
    assert out[0] == 2 and out[1] is loop


def test_values_that_are_no_container_have_no_leaves():
    value = {"s": "abc", "b": b"xy", "n": None, "set": {1, 2}, "arr": np.ones(2)}
    assert tree.flatten(value, is_int) == []
    assert tree.map_leaves(value, lambda v: 0, is_int) is value


nested = st.recursive(
    st.integers() | st.text(max_size=3) | st.none(),
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
    | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    | st.tuples(inner, inner).map(lambda t: Point(*t)) | st.tuples(inner, inner).map(lambda t: Pair(*t)),
    max_leaves=20)


@given(nested)
@pytest.mark.slow
def test_replace_with_its_own_leaves_is_the_identity(value):
    assert tree.replace(value, tree.flatten(value, is_int), is_int) == value


@given(nested)
@pytest.mark.slow
def test_map_then_flatten_is_flatten_then_map(value):
    assert tree.flatten(tree.map_leaves(value, lambda v: v * 2 + 1, is_int), is_int) == \
        [v * 2 + 1 for v in tree.flatten(value, is_int)]


@given(nested, st.data())
@pytest.mark.slow
def test_replace_by_index_changes_exactly_those_leaves(value, data):
    leaves = tree.flatten(value, is_int)
    chosen = data.draw(st.sets(st.integers(0, max(len(leaves) - 1, 0)), max_size=len(leaves)))
    out = tree.flatten(tree.replace(value, {k: ("new", k) for k in chosen}, is_int),
                       lambda v: is_int(v) or (isinstance(v, tuple) and v[:1] == ("new",)))
    assert out == [("new", k) if k in chosen else v for k, v in enumerate(leaves)]


# the leaf rule -----------------------------------------------------------------------------------

TORCH_FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
PADDLE_FLOATS = ["float16", "bfloat16", "float32", "float64"]


@pytest.mark.parametrize("dtype", TORCH_FLOATS)
def test_every_torch_float_width_is_a_leaf(dtype):
    t = torch.ones(2, dtype=dtype)
    assert tree.is_float_tensor(t) and torch_side.is_float_tensor(t)
    assert tree.flatten({"out": (t,)}) == [t]


@pytest.mark.parametrize("dtype", PADDLE_FLOATS)
def test_every_paddle_float_width_is_a_leaf(dtype):
    t = paddle.ones([2], dtype=dtype)
    assert tree.is_float_tensor(t) and paddle_side.is_float_tensor(t)
    assert [id(v) for v in tree.flatten([Point(t, None)])] == [id(t)]


@pytest.mark.parametrize("make", [lambda: torch.arange(3), lambda: torch.tensor([True]),
                                  lambda: paddle.arange(3), lambda: paddle.to_tensor([True]),
                                  lambda: np.ones(2, dtype=np.float32), lambda: 1.5])
def test_integer_bool_tensors_arrays_and_numbers_are_no_float_leaves(make):
    value = make()
    assert not tree.is_float_tensor(value)
    assert tree.is_tensor(value) == (torch.is_tensor(value) or isinstance(value, paddle.Tensor))


def test_the_adapters_agree_with_the_rule():
    values = [torch.ones(1, dtype=d) for d in TORCH_FLOATS + [torch.int64, torch.bool, torch.complex64]] + \
             [paddle.ones([1], dtype=d) for d in PADDLE_FLOATS + ["int64", "bool", "complex64"]]
    for v in values:
        side = torch_side if torch.is_tensor(v) else paddle_side
        assert side.is_float_tensor(v) == tree.is_float_tensor(v), v.dtype
        assert side.is_tensor(v) and tree.is_tensor(v)


def test_tensors_of_both_frameworks_in_one_output():
    t, p = torch.ones(1, dtype=torch.bfloat16), paddle.ones([1], dtype="float16")
    out = tree.map_leaves({"t": t, "p": p, "ids": torch.arange(2)}, lambda v: v * 2)
    assert out["t"].dtype == torch.bfloat16 and out["t"].tolist() == [2.0]
    assert out["p"].dtype == paddle.float16 and out["p"].numpy().tolist() == [2.0]
