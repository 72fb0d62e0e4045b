"""What one group of the per-layer backward's rows compares: a torch module on its recorded call
against a paddle layer, or the torch modules one paddle layer fuses (q|k|v, gate|up) as one unit, run
together on their one input, their output gradients laid out as the plan lays out the fused output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..compare.capture import Call
from ..paths import relative
from ..tree import map_leaves


@dataclass(frozen=True)
class Unit:
    """`get(model)`: the module in a torch model; `local(name)`: a torch parameter's name in it (None:
    not in it); `p_grads`: the output gradients handed to paddle's layer; `reading(outputs)`: paddle's
    outputs as torch's."""

    call: Call
    grads: list
    ppath: str
    get: Callable
    local: Callable
    p_grads: list
    reading: Callable

    @property
    def label(self) -> str:
        return self.call.path or "<model>"

    @classmethod
    def of(cls, call: Call, ppath: str) -> Unit:
        grads = [o.grad for o in call.outputs]
        return cls(call, grads, ppath, lambda m: m.get_submodule(call.path) if call.path else m,
                   lambda name: relative(name, call.path), grads, lambda outputs: outputs)

    @classmethod
    def fused(cls, calls: dict, ppath: str, group: tuple) -> Unit | None:
        """The torch modules of `group` ((path, Slice) in the plan's order) as one unit against the
        paddle layer fusing them: their output gradients laid out as paddle's output holds them."""
        import torch
        found = [calls.get(t) for t, _ in group]
        if any(c is None or len(c.outputs) != 1 for c in found):
            return None  # a module not called, or with an output of no gradient: judged within its parent
        paths, parts = [t for t, _ in group], [part for _, part in group]
        first = found[0]
        call = Call("+".join(paths), "fused", min(c.start for c in found), max(c.end for c in found), first.args,
                    first.kwargs, [c.outputs[0] for c in found], count=max(c.count for c in found))
        grads = [torch.zeros_like(c.outputs[0]) if (g := c.outputs[0].grad) is None else g for c in found]

        def local(name):
            i = next((i for i, t in enumerate(paths) if relative(name, t) is not None), None)
            return None if i is None else f"parts.{i}.{relative(name, paths[i])}"
        p_grads = grads if parts[0].output is not None else [_laid_out(grads, parts)]  # one output per module
        return cls(call, grads, ppath, lambda m: _together([m.get_submodule(t) for t in paths]), local, p_grads,
                   lambda outputs: [part.of(outputs)[0] for part in parts])


def _laid_out(grads: list, parts: list):
    """Torch's gradients of the modules a paddle layer fuses, as one gradient of its output: each
    module's elements at its slice's runs, in its own order."""
    import torch
    axis = parts[0].axis
    shape = list(grads[0].shape)
    shape[axis] = sum(g.shape[axis] for g in grads)
    out = torch.zeros(shape, dtype=grads[0].dtype, device=grads[0].device)
    for g, part in zip(grads, parts):
        offset = 0
        for a, b in part.spans:
            out.narrow(axis, a, b - a).copy_(g.narrow(axis, offset, b - a))
            offset += b - a
    return out


def _together(modules: list):
    """The torch modules one paddle layer fuses as one module: called on one input, their outputs
    in the plan's order."""
    import torch

    class Together(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.parts = torch.nn.ModuleList(modules)

        def forward(self, *args, **kwargs):
            return [m(*args, **kwargs) for m in self.parts]
    return Together()


def outputs_handed_on(model, paths) -> list:
    """Hooks making each module at `paths` return a copy of every output that takes a gradient, a
    node of its own on the graph: the gradient retained on it is then the one the rest of the model
    gives that output. On the tensor itself it would also hold what the module's own computation
    passes back into it: HF's decoder attention returns the keys and values its output was computed
    from (its cache), and their gradient from that output would count twice in its local backward."""
    import torch

    def copies(module, args, output):
        return map_leaves(output, lambda t: t.clone() if t.requires_grad else t,
                          lambda v: isinstance(v, torch.Tensor) and v.is_floating_point())
    return [model.get_submodule(path).register_forward_hook(copies) for path in paths]
