"""PaddleFormers' LMHead: the language-model head of PaddleFormers 1.2's causal LMs, its own layer
class rather than a paddle.nn.Linear. It keeps HF's weight layout, [vocab, hidden] (not
transposed, unlike a paddle Linear), with an optional bias [vocab] (config `lm_head_bias`), and
computes matmul(hidden_states, weight, transpose_y=True) + bias: a torch Linear's
F.linear(x, weight, bias) on the same tensors. It stands beside the Linear entry, for a torch
Linear ported as an LMHead only."""

from ..diagnosis import Diagnosis
from . import Family, register, same_weight_and_bias
from .linear import _linear_products, square_weight_held_as


def transposed(ctx, where, torch_module, paddle_layer) -> list:
    """A square LMHead weight that holds torch's transposed, as a paddle Linear's would."""
    shape = square_weight_held_as(torch_module, paddle_layer, lambda w: w.T)
    if shape is None:
        return []
    return [Diagnosis(where, f"paddle's {type(paddle_layer).__name__} weight {shape} holds torch's "
                      f"'{where}.weight' transposed",
                      "PaddleFormers' LMHead stores [vocab, hidden] as torch's Linear does and multiplies by its "
                      "transpose: copy the weight as it is (no transpose rule for it)", kind="transpose")]


# the weight is [vocab, hidden] on both sides: never transposed, even when square
register(Family("paddleformers-lmhead", ("Linear",), ("LMHead",), same_weight_and_bias, _linear_products, kind="linear",
                what_ifs=(transposed,), paddle_specific=True))
