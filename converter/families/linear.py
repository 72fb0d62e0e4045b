"""Linear: torch stores weight [out, in], paddle [in, out]. HF GPT-2's Conv1D is already [in, out]."""

from . import LayerFamily, LayerPair, register


def _linear(pair: LayerPair) -> None:
    pair.rename("weight", transpose=True)
    pair.rename("bias")


def _hf_conv1d(pair: LayerPair) -> None:
    pair.rename("weight")  # already [in, out]: never transpose
    pair.rename("bias")


register(LayerFamily("linear", ("Linear", "LazyLinear"), ("Linear",), _linear))
register(LayerFamily("hf-conv1d", ("Conv1D",), ("Linear", "Conv1D"), _hf_conv1d))
