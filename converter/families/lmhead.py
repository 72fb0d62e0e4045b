"""PaddleFormers' LMHead: the language-model head of PaddleFormers 1.2's causal LMs, its own layer
class rather than a paddle.nn.Linear. It keeps HF's weight layout, [vocab, hidden] (not
transposed, unlike a paddle Linear), with an optional bias [vocab] (config `lm_head_bias`), and
computes matmul(hidden_states, weight, transpose_y=True) + bias: a torch Linear's
F.linear(x, weight, bias) on the same tensors. It stands beside the Linear entry, for a torch
Linear ported as an LMHead only."""

from ..diagnosis import Diagnosis
from . import Family, PortedLayer, register
from .linear import _as_numpy, _linear_products


def _lm_head(pair: PortedLayer) -> None:
    pair.rename("weight")  # [vocab, hidden] on both sides: never transposed, even when square
    pair.rename("bias")


def transposed(ctx, where, torch_module, paddle_layer) -> list:
    """A square LMHead weight that holds torch's transposed, as a paddle Linear's would."""
    import numpy as np
    if getattr(torch_module, "weight", None) is None or getattr(paddle_layer, "weight", None) is None:
        return []
    w, pw = torch_module.weight.detach().cpu().numpy(), _as_numpy(paddle_layer.weight)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or pw.shape != w.shape or not np.array_equal(pw, w.T) \
            or np.array_equal(w, w.T):
        return []
    return [Diagnosis(where, f"paddle's {type(paddle_layer).__name__} weight {list(pw.shape)} holds torch's "
                      f"'{where}.weight' transposed",
                      "PaddleFormers' LMHead stores [vocab, hidden] as torch's Linear does and multiplies by its "
                      "transpose: copy the weight as it is (no transpose rule for it)", kind="transpose")]


register(Family("paddleformers-lmhead", ("Linear",), ("LMHead",), _lm_head, _linear_products, kind="linear",
                what_ifs=(transposed,), paddle_specific=True))
