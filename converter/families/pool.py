"""Average pooling: torch counts padding in the mean by default (count_include_pad=True),
paddle excludes it by default (exclusive=True): the opposite."""

from ..diagnosis import Diagnosis
from . import Family, register


def padding_in_mean(ctx, where, torch_module, paddle_layer) -> list:
    if not hasattr(paddle_layer, "exclusive") or bool(torch_module.count_include_pad) != bool(paddle_layer.exclusive):
        return []
    return [Diagnosis(where, f"AvgPool padding: torch count_include_pad={torch_module.count_include_pad}, paddle "
                      f"exclusive={paddle_layer.exclusive} (paddle's default excludes padding, torch's includes it)",
                      f"construct the paddle pool with exclusive={not torch_module.count_include_pad}", kind="pool padding")]


register(Family("avg-pool", ("AvgPool1d", "AvgPool2d", "AvgPool3d"), ("AvgPool1D", "AvgPool2D", "AvgPool3D"),
                what_ifs=(padding_in_mean,)))
