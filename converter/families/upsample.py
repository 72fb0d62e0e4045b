"""Interpolation: mode and align_corners on both sides; paddle's align_mode=1 samples
differently from torch's half-pixel rule (align_mode=0) when align_corners is False."""

from ..diagnosis import Diagnosis
from . import Family, register


def sampling(ctx, where, torch_module, paddle_layer) -> list:
    m, p = torch_module, paddle_layer
    if not hasattr(p, "align_corners"):
        return []
    t_ac = bool(m.align_corners)
    if t_ac != bool(p.align_corners) or getattr(m, "mode", None) != getattr(p, "mode", None):
        return [Diagnosis(where, f"interpolation differs: torch mode={m.mode} align_corners={t_ac}, paddle "
                          f"mode={p.mode} align_corners={p.align_corners}",
                          f"use mode='{m.mode}', align_corners={t_ac} in paddle", kind="interpolation")]
    if not t_ac and getattr(p, "align_mode", 0) != 0 and m.mode in ("linear", "bilinear", "trilinear"):
        return [Diagnosis(where, f"interpolation align_mode={p.align_mode} in paddle; torch's half-pixel sampling is "
                          "align_mode=0", "use align_mode=0 in paddle", kind="interpolation")]
    return []


register(Family("upsample", ("Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"),
                ("Upsample", "UpsamplingNearest2D", "UpsamplingBilinear2D"), what_ifs=(sampling,)))
