"""Embedding: [num, dim] on both sides; never transposed, even when square."""

from . import Family, PortedLayer, register


def _embedding(pair: PortedLayer) -> None:
    pair.rename("weight")


register(Family("embedding", ("Embedding",), ("Embedding",), _embedding))
