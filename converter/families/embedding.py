"""Embedding: [num, dim] on both sides; never transposed, even when square."""

from . import LayerFamily, LayerPair, register


def _embedding(pair: LayerPair) -> None:
    pair.rename("weight")


register(LayerFamily("embedding", ("Embedding",), ("Embedding",), _embedding))
