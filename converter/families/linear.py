"""Linear: torch stores weight [out, in], paddle [in, out]. HF GPT-2's Conv1D is already
[in, out]. Bilinear: weight [out, in1, in2] on both sides; paddle's bias is [1, out]."""

from ..diagnosis import Diagnosis
from . import Family, PortedLayer, register, same_weight_and_bias


def _linear(pair: PortedLayer) -> None:
    pair.rename("weight", transpose=True)
    pair.rename("bias")


def _bilinear(pair: PortedLayer) -> None:
    same_weight_and_bias(pair)
    pair.reshape("bias", [1, pair.torch_module.out_features])


def _linear_products(module, args, weight2, square):
    import torch.nn.functional as F
    return F.linear(square(args[0]), weight2), module.in_features


def _hf_conv1d_products(module, args, weight2, square):
    return square(args[0]) @ weight2, weight2.shape[0]


def _bilinear_products(module, args, weight2, square):
    import torch.nn.functional as F
    return F.bilinear(square(args[0]), square(args[1]), weight2), module.in1_features * module.in2_features


def square_weight_held_as(torch_module, paddle_layer, layout) -> list | None:
    """The shape of the paddle layer's weight when it holds torch's square weight `w` as `layout(w)`
    (a layout the port does not want), found from the two layers themselves, whatever the mapping
    says; None otherwise, and for a symmetric weight, which both layouts hold alike."""
    import numpy as np

    from .router import as_numpy
    if getattr(torch_module, "weight", None) is None or getattr(paddle_layer, "weight", None) is None:
        return None
    w, pw = torch_module.weight.detach().cpu().numpy(), as_numpy(paddle_layer.weight)[0]
    if w.ndim != 2 or w.shape[0] != w.shape[1] or pw.shape != w.shape or not np.array_equal(pw, layout(w)) \
            or np.array_equal(w, w.T):
        return None
    return list(pw.shape)


def untransposed(ctx, where, torch_module, paddle_layer) -> list:
    """A square paddle weight that is torch's as is, where the layer reproduces torch's once it is
    transposed (paddle.nn.Linear wants [in, out]; paddle.compat.nn.Linear holds torch's layout and
    is never told to transpose)."""
    from .probe import runs_transposed
    shape = square_weight_held_as(torch_module, paddle_layer, lambda w: w)
    if shape is None or not runs_transposed(torch_module, paddle_layer):
        return []
    return [Diagnosis(where, f"paddle's {type(paddle_layer).__name__} weight {shape} is square and holds "
                      f"torch's '{where}.weight' untransposed",
                      "the layer stores [in, out]: transpose torch's [out, in] weight (a rule file needs a "
                      "transpose rule for it; confirmed by re-running the layer with it transposed)", kind="transpose")]


register(Family("linear", ("Linear", "LazyLinear"), ("Linear",), _linear, _linear_products, what_ifs=(untransposed,)))
# HF's Conv1D weight is already [in, out]: never transposed
register(Family("hf-conv1d", ("Conv1D",), ("Linear", "Conv1D"), same_weight_and_bias, _hf_conv1d_products))
register(Family("bilinear", ("Bilinear",), ("Bilinear",), _bilinear, _bilinear_products))
