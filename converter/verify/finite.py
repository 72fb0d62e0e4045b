"""No PASS on values that are not numbers: a NaN or an infinity in a compared layer's outputs.

The layer comparisons take positions both sides fill with a large negative value as a mask and
leave them out (compare/matching.masked_alike); an infinity that float32 overflowed to on both
sides (inputs near float32's largest value, 3.4e38) looked like one, and the run passed on it.
After a strategy has judged its rows, the outputs of every paired layer its last full capture
recorded are looked at once more, on each side:

- torch's own run is the reference: a NaN or an infinity there (the first layer to give one,
  in execution order) leaves nothing to compare the port with: exit 2, saying the inputs
  overflow float32 (or, for a layer that returns a mask of -inf, what to return instead);
- paddle's run holding a NaN or an infinity where torch's value is finite, from inputs that hold
  none, fails that layer, whatever its ratio said; but for -inf where torch holds float32's lowest value (HF's mask value,
  which a port may spell as -inf).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..compare.replay import to_numpy_list
from ..errors import UserError
from ..tree import flatten

LOWEST = -3.0e38  # at or below: float32's lowest, torch.finfo(float32).min, as HF masks with


def _first_bad(arrays) -> tuple[int, int, float] | None:
    """(output number, flat index, value) of the first NaN or infinity in `arrays`, or None."""
    for k, a in enumerate(arrays):
        if a.dtype.kind == "f" and a.size and not np.isfinite(a).all():
            i = int(np.flatnonzero(~np.isfinite(a))[0])
            return k, i, float(a.flat[i])
    return None


def check_finite(found, results: list) -> list:
    """`results` with a paddle layer whose outputs hold a NaN or an infinity where torch's are finite
    failed (see the module's docstring); a UserError where torch's own outputs hold one."""
    if found.calls is None or found.pairs is None:
        return results
    t_calls, p_calls = found.calls
    torch_bad, paddle_bad = [], {}
    for pair in found.pairs:
        t_call, p_call = t_calls.get(pair.torch), p_calls.get(pair.paddle)
        if t_call is None or p_call is None or not t_call.outputs or not p_call.outputs:
            continue
        y_t = to_numpy_list(t_call.outputs, "torch")
        where = _first_bad(y_t)
        if where is not None:
            torch_bad.append((t_call.end, pair.torch, t_call.type, where))
            continue
        y_p = to_numpy_list(p_call.outputs, "paddle")
        if len(y_p) != len(y_t) or _first_bad(to_numpy_list(flatten((p_call.args, p_call.kwargs)), "paddle")):
            continue  # paddle's inputs hold a NaN or an infinity already: the layer that made them is to blame
        for k, (a, b) in enumerate(zip(y_t, y_p)):
            if a.shape != b.shape or b.dtype.kind != "f" or np.isfinite(b).all():
                continue
            with np.errstate(invalid="ignore"):  # -inf where torch holds float32's lowest (HF's mask): a mask too
                wrong = ~np.isfinite(b) & ~((b == -np.inf) & (a <= LOWEST))
            if wrong.any():
                i = int(np.flatnonzero(wrong)[0])
                paddle_bad[pair.torch] = (f"paddle's output {k} holds {float(b.flat[i])} at element {i}, where torch's "
                                          f"is {float(a.flat[i]):.6g}", int(np.isnan(b).sum()), int(np.isinf(b).sum()))
                break
    if torch_bad:
        _, path, kind, (k, i, value) = min(torch_bad, key=lambda bad: bad[0])
        raise UserError(f"torch_model()'s own run gives {value} at element {i} of output {k} of "
                        f"{repr(path) if path else '<model>'} ({kind}), the first layer whose outputs are not finite: "
                        "with no finite reference there is nothing to compare the port with; the inputs overflow "
                        "float32 (which holds up to 3.4e38): give inputs of a smaller scale (a layer that returns "
                        "a mask of -inf: return torch.finfo(dtype).min, as HF does)")
    out = []
    for r in results:
        if r.torch in paddle_bad and r.within_budget is not False:
            said, nan, inf = paddle_bad[r.torch]
            r = dataclasses.replace(r, ratio=float("inf"), nan=max(r.nan, nan), inf=max(r.inf, inf),
                                    note="; ".join(filter(None, (r.note, said))))
        out.append(r)
    return out
