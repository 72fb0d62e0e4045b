"""Re-runs judged where the culprit's row was judged: at an input its own code computed for a child.

A layer's row takes the worst of its output and the inputs its own code hands its children (an
activation called between two Linear layers is the second one's input). Where the worst is such
an input (LayerResult.worst_input), a change that puts the layer's output within its budget need
not reach that input, and one that does may leave the output unchanged after a norm: the searches
then run the culprit with its child's inputs recorded and judge those, against torch's at the same
child, under the budget an input gets (compare/budget.py INPUT: torch's own error there, from its
float64 module run on the same inputs)."""

from __future__ import annotations

import numpy as np

from ..compare.budget import INPUT, budget_for


def _child_inputs(run, child, side) -> tuple[list[np.ndarray], object]:
    """(the floating inputs of `child`'s first call while `run()` runs, as numpy arrays; what `run()` gave)."""
    from ..compare.capture import call_tensors
    seen = []

    def pre(layer, args, kwargs):
        if not seen:
            seen.append([side.to_numpy(t) for t in call_tensors(args, kwargs, side.is_float_tensor)])
    handles = side.add_hooks(child, pre)
    try:
        given = run()
    finally:
        for h in handles:
            h.remove()
    return (seen[0] if seen else []), given


class ChildInputs:
    """Torch's inputs of the culprit's child `pair` (fp32, as recorded, and their float64 reference),
    the budget of each, and paddle's child inputs on a re-run judged against them."""

    def __init__(self, ctx, pair, output_ratio):
        from ..compare.replay import run_torch64, run_torch_module
        from ..frameworks import paddle_side, torch_side
        session, call = ctx.session, ctx.t_call
        self.paddle_child = session.paddle_layer(pair.paddle)
        self.side = paddle_side
        self.output_ratio = output_ratio
        t, _ = _child_inputs(lambda: run_torch_module(session.torch_module(ctx.result.torch), call),
                             session.torch_module(pair.torch), torch_side)
        t64, _ = _child_inputs(lambda: run_torch64(session.torch64_module(ctx.result.torch), call),
                               session.torch64_module(pair.torch), torch_side)
        self.torch = [a for a, b in zip(t, t64) if a.shape == b.shape]
        self.budgets = [budget_for(INPUT, session.formats, a, np.subtract(b, a, dtype=np.float64).astype(np.float32))
                        for a, b in zip(t, t64) if a.shape == b.shape]

    def run(self, run):
        """`run` (which runs the paddle culprit) made to give its child's floating inputs too."""
        return lambda: _child_inputs(run, self.paddle_child, self.side)

    def ratio(self, ran: tuple) -> float | None:
        """The worst of the child's inputs against torch's under their budgets, and of the layer's
        outputs under theirs (a change that mends the child's input and breaks the output, an
        activation held once and called in two places, is no cause); None where they do not pair
        (another count, another shape)."""
        inputs, outputs = ran
        if not self.torch or len(inputs) != len(self.torch) or any(a.shape != b.shape for a, b in zip(inputs, self.torch)):
            return None
        output = self.output_ratio(outputs)
        if output is None:
            return None
        diffs = (np.abs(np.nan_to_num(np.subtract(a, b, dtype=np.float64), nan=np.inf)) for a, b in zip(inputs, self.torch))
        return max([output] + [budget.judge(d.astype(np.float32)).ratio for budget, d in zip(self.budgets, diffs)])


def child_of(ctx, output_ratio) -> ChildInputs | None:
    """The child input the culprit's row was judged at, where it was one (`output_ratio(outputs)`
    judges the layer's own outputs beside it); None otherwise."""
    where = ctx.result.worst_input
    if not where or ctx.t_call is None:
        return None
    pair = next((p for p in ctx.pairs if p.torch == where), None)
    if pair is None:
        return None
    child = ChildInputs(ctx, pair, output_ratio)
    return child if child.torch else None  # no floating input there (bucket ids): judged at the outputs
