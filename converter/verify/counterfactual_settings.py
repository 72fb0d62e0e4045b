"""The settings a layer keeps: the plain values its constructor stored and its forward reads (a flag,
a number, a word, a short tuple of numbers), beyond what every layer of its framework keeps; and
when two of them are the same value (a flag is not the number 1, a tuple is its list)."""

from __future__ import annotations


def _plain(value) -> bool:
    if isinstance(value, (bool, int, float, str)):
        return not isinstance(value, str) or 0 < len(value) <= 24
    return (isinstance(value, (tuple, list)) and 0 < len(value) <= 6
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))


def settings(layer, framework_keys: frozenset) -> dict:
    """The plain values `layer` keeps on itself, beyond what every layer of its framework keeps."""
    return {k: v for k, v in vars(layer).items() if k not in framework_keys and _plain(v)}


def same(a, b) -> bool:
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        a, b = (tuple(x) if isinstance(x, (tuple, list)) else (x,) for x in (a, b))
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return isinstance(a, bool) == isinstance(b, bool) and isinstance(a, str) == isinstance(b, str) and a == b


def constructor_parameter(layer, setting: str) -> str | None:
    """The argument of the layer's constructor that sets `setting` (its name less leading
    underscores), or None where the constructor takes none of that name."""
    import inspect
    try:
        names = inspect.signature(type(layer).__init__).parameters
    except (TypeError, ValueError):
        return None
    bare = setting.lstrip("_")
    return bare if bare in names else None
