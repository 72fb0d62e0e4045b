"""Embedding: [num, dim] on both sides; never transposed, even when square. Paddle's padding_idx
is not torch's: paddle returns zeros for the pad id, torch returns the stored row (its
padding_idx only keeps the row's gradient at zero)."""

from ..diagnosis import Diagnosis
from . import Family, PortedLayer, register


def _embedding(pair: PortedLayer) -> None:
    pair.rename("weight")


def padding_row(ctx, where, torch_module, paddle_layer) -> list:
    """A paddle Embedding with a padding_idx whose row torch stores as other than zeros: paddle's
    output is zeros at that id, torch's the row."""
    pad = getattr(paddle_layer, "_padding_idx", None)
    weight = getattr(torch_module, "weight", None)
    if pad is None or weight is None or not -weight.shape[0] <= pad < weight.shape[0]:
        return []
    row = weight.detach()[pad]
    if not bool(row.any()):
        return []
    torch_pad = getattr(torch_module, "padding_idx", None)
    return [Diagnosis(where, f"paddle's Embedding has padding_idx={pad} and returns zeros for that id, where torch "
                      f"(padding_idx={torch_pad}) returns its stored row {pad}, which is not zero (max abs "
                      f"{float(row.abs().max()):.3g})",
                      "construct the paddle Embedding without padding_idx (torch's padding_idx only stops that row's "
                      "gradient), or zero the row on both sides if the model means it", kind="padding idx")]


register(Family("embedding", ("Embedding",), ("Embedding",), _embedding, what_ifs=(padding_row,)))
