"""Convolutions keep their layout: [out, in/g, k...] and, transposed, [in, out/g, k...] on both sides."""

from . import LayerFamily, LayerPair, register


def _conv(pair: LayerPair) -> None:
    pair.rename("weight")
    pair.rename("bias")


register(LayerFamily("conv", ("Conv1d", "Conv2d", "Conv3d"), ("Conv1D", "Conv2D", "Conv3D"), _conv))
register(LayerFamily("conv-transpose", ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"),
                     ("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"), _conv))
