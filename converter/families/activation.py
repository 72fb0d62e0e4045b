"""Activations with parameters: PReLU's weight is `_weight` in paddle."""

from . import LayerFamily, LayerPair, register


def _prelu(pair: LayerPair) -> None:
    pair.rename("weight", "_weight")


register(LayerFamily("prelu", ("PReLU",), ("PReLU",), _prelu))
