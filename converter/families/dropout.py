"""Dropout layers: no weights; in eval torch's is the identity. They pair with each other by
kind, so that one left active is found at its own place. paddle's `Dropout(mode=
"downscale_in_infer")` (paddle.vision's AlexNet, SqueezeNet, Inception-v3) scales by 1 - p in eval
instead: the what-if confirms it by the output itself."""

from ..diagnosis import Diagnosis
from . import Family, register


def downscaled_in_eval(ctx, where, torch_module, paddle_layer) -> list:
    """What-if: paddle's dropout scales its input by 1 - p in eval, where torch's passes it on:
    is paddle's output torch's scaled by 1 - p?"""
    import numpy as np

    ev = ctx.evidence
    p = getattr(paddle_layer, "p", None)
    if where != ctx.name or ev is None or ev.y_local is None or ev.y_torch is None or not isinstance(p, float) \
            or not 0 < p < 1 or getattr(paddle_layer, "mode", None) != "downscale_in_infer":
        return []
    y, got = np.asarray(ev.y_torch, np.float64), np.asarray(ev.y_local, np.float64)
    scale = float(np.abs(y).max()) + 1e-30
    if y.shape != got.shape or float(np.abs(got - (1 - p) * y).max()) > 1e-5 * scale:
        return []
    return [Diagnosis(where, f"paddle's {type(paddle_layer).__name__} runs with mode='downscale_in_infer': in eval it "
                      f"scales its input by 1 - p = {1 - p:g}, where torch's passes it on unchanged (confirmed: paddle's "
                      "output is torch's scaled by that)",
                      "construct it with mode='upscale_in_train' (paddle's default, torch's convention)",
                      kind="dropout scaling")]


register(Family("dropout", ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout"),
                ("Dropout", "Dropout2D", "Dropout3D", "AlphaDropout"), kind="dropout", what_ifs=(downscaled_in_eval,)))
