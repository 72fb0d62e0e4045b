"""Pitfalls of real model ports, checked by a what-if on the recorded inputs.

Attention: the torch module is re-run in float64 on its recorded inputs with one choice
made differently (no causal mask, another logit scale, query and key exchanged); when that
lands on paddle's output where torch's own does not, that choice is the cause. A rotary
table (HF 5's rotary embeddings, built from the config's rope_parameters) likewise: rebuilt
from the paddle model's value of each rotary field that differs, and with YaRN's factor read
from max_position_embeddings / original_max_position_embeddings; where it holds one table per layer
type (HF 5's Gemma 3), each type's table rebuilt from another type's parameters and from the
paddle config's. Also: a mask that masks
positions on one side only, and an output head whose weight torch ties to another module's
and paddle no longer does; routing weights of an experts module applied to other tokens
(read as [experts, tokens] where they are [tokens, experts]). Same signature as diagnose.py: check(ctx).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from ..patches import thread_patch
from .report import Diagnosis

QUERY_NAMES = {"q_proj", "query", "query_proj", "q", "q_lin", "wq"}
KEY_NAMES = {"k_proj", "key", "key_proj", "k", "k_lin", "wk"}
FUSED_QKV_NAMES = {"c_attn"}  # HF GPT-2: [q | k | v] along the last axis
HIT = 1e-2  # a what-if explains the difference when it leaves less than this share of it


def _projections(module) -> tuple[list, list, list]:
    """(query projections, key projections, fused qkv projections) inside `module`."""
    q, k, fused = [], [], []
    for name, m in module.named_modules():
        last = name.rsplit(".", 1)[-1]
        (q if last in QUERY_NAMES else k if last in KEY_NAMES else fused if last in FUSED_QKV_NAMES else []).append(m)
    return q, k, fused


def _head_dim(module) -> int | None:
    for _, m in module.named_modules():
        for attr in ("head_dim", "attention_head_size", "head_size", "key_value_proj_dim"):  # the last: HF T5
            value = getattr(m, attr, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


@contextlib.contextmanager
def _hooked(modules, hook):
    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _scaled_queries(module, factor: float):
    q, _, fused = _projections(module)

    def scale_fused(m, args, out):
        out = out.clone()
        third = out.shape[-1] // 3
        out[..., :third] *= factor
        return out
    with _hooked(q, lambda m, a, out: out * factor), _hooked(fused, scale_fused):
        yield


@contextlib.contextmanager
def _exchanged(module):
    import torch.nn.functional as F
    q, k, fused = _projections(module)
    pairs = [(a, b) for a, b in zip(q, k) if hasattr(a, "weight") and hasattr(b, "weight")
             and tuple(a.weight.shape) == tuple(b.weight.shape)]

    def as_other(other):
        return lambda m, args, out: F.linear(args[0], other.weight, other.bias)

    def swap_fused(m, args, out):
        third = out.shape[-1] // 3
        return out[..., [*range(third, 2 * third), *range(third), *range(2 * third, out.shape[-1])]]
    with contextlib.ExitStack() as stack:
        for a, b in pairs:
            stack.enter_context(_hooked([a], as_other(b)))
            stack.enter_context(_hooked([b], as_other(a)))
        stack.enter_context(_hooked(fused, swap_fused))
        yield


@contextlib.contextmanager
def _not_causal(module):
    """Causal masks off: triangular boolean buffers (HF GPT-2's `bias`) all True, and the
    fused attention kernel asked for no causal mask."""
    import torch
    import torch.nn.functional as F
    saved = []
    for m in module.modules():
        for name, buf in list(m.named_buffers(recurse=False)):
            if buf.dtype == torch.bool and buf.dim() >= 2 and buf.shape[-1] == buf.shape[-2] and buf.shape[-1] > 1 \
                    and bool(torch.equal(buf, torch.tril(torch.ones_like(buf)))):
                saved.append((m, name, buf))
                setattr(m, name, torch.ones_like(buf))
    def not_causal(sdpa):
        def no_causal(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
            return sdpa(q, k, v, attn_mask=None if is_causal else attn_mask, dropout_p=dropout_p, is_causal=False, **kw)
        return no_causal
    try:
        with thread_patch(F, "scaled_dot_product_attention").patched(not_causal):  # this thread's calls alone
            yield
    finally:
        for m, name, buf in saved:
            setattr(m, name, buf)


def _without_masks(call, causal: bool):
    """The call with its additive masks replaced by zeros: the causal ones (exactly the positions
    after each query masked) when `causal`, else the others (padding)."""
    import torch
    from ..compare.capture import Call, replace_call_tensors
    from ..compare.matching import MASKED_BELOW, is_causal
    from ..frameworks import torch_side
    from ..compare.replay import torch_inputs
    new = {}
    for i, t in enumerate(torch_inputs(call)):
        if not t.is_floating_point() or t.dim() < 2:
            continue
        masked = (t <= MASKED_BELOW).cpu().numpy()
        if masked.any() and np.all(masked | (t == 0).cpu().numpy()) \
                and (t.shape[-2] > 1 and is_causal(masked[..., :, : t.shape[-2]])) == causal:
            new[i] = torch.zeros_like(t)
    if not new:
        return None
    args, kwargs = replace_call_tensors(call.args, call.kwargs, torch_side.is_tensor, new)
    return Call(call.path, call.type, call.start, call.end, args, kwargs)


def _what_if(ctx, change, call=None) -> bool:
    """Whether torch's module, changed, lands on paddle's output where torch's own does not."""
    from .analyze import laid_out
    from ..compare.matching import masked_alike
    from ..compare.replay import run_torch64
    ev = ctx.evidence
    if ev is None or ev.y_local is None or ev.y64 is None or ev.pairs is None or ctx.t_call is None:
        return False
    module64 = ctx.session.torch64_module(ctx.result.torch)
    try:
        with change(module64):
            y = laid_out(ev.pairs.of_torch(run_torch64(module64, call or ctx.t_call)), ev.pairs.shapes)
    except Exception:
        return False
    if y.shape != ev.y_local.shape:
        return False
    # positions both sides mask (a position bias that carries its mask: HF's lowest float, PaddleNLP's
    # -1e4) hold no error, and a what-if that only moves them is no hit
    masked = masked_alike(ev.y64, ev.y_local)
    kept = slice(None) if masked is None else ~masked
    before = float(np.max(np.abs(ev.y64 - ev.y_local)[kept], initial=0.0))
    after = float(np.max(np.abs(y - ev.y_local)[kept], initial=0.0))
    return before > 0 and after < HIT * before


def check_attention(ctx) -> list[Diagnosis]:
    q, k, fused = _projections(ctx.torch_module)
    if not (q and k) and not fused:
        return []
    name = ctx.name
    if ctx.t_call is not None and _what_if(ctx, _not_causal, _without_masks(ctx.t_call, causal=True) or ctx.t_call):
        return [Diagnosis(name, "attention without its causal mask: paddle's output is torch's with every position "
                          "attending to later ones", "pass the causal mask to the paddle attention (or build it "
                          "inside, as torch's does) and add it to the logits before the softmax", kind="causal mask")]
    padding_free = _without_masks(ctx.t_call, causal=False) if ctx.t_call is not None else None
    if padding_free is not None and _what_if(ctx, contextlib.nullcontext, padding_free):
        return [Diagnosis(name, "attention without its padding mask: paddle's output is torch's with padded "
                          "positions attended to", "pass the attention mask on to the paddle attention and add it "
                          "to the logits (mind its convention: additive, or boolean with True kept)", kind="padding mask")]
    d = _head_dim(ctx.torch_module)
    if d:
        for factor, said in ((1 / math.sqrt(d), f"1/sqrt({d})"), (math.sqrt(d), f"sqrt({d})"),
                             (1 / d, f"1/{d}"), (math.sqrt(d) ** 0.5, f"{d}^(1/4)")):
            if _what_if(ctx, lambda m, f=factor: _scaled_queries(m, f)):
                return [Diagnosis(name, f"attention logit scale: paddle's q.k is torch's times {said} = {factor:.4g} "
                                  f"(head size {d}; e.g. 1/{d} where torch uses 1/sqrt({d}), 1 where it uses "
                                  f"1/sqrt({d}), or 1/sqrt({d}) where torch does not scale, as T5)",
                                  f"scale paddle's logits as torch does: multiply them by {1 / factor:.4g}", kind="attention scale")]
    if _what_if(ctx, _exchanged):
        return [Diagnosis(name, "query and key exchanged: paddle's output is torch's with the query and key "
                          "projections swapped", "check the mapping of q_proj/k_proj (or query/key) and the order "
                          "in which the paddle attention uses them", kind="query key swap")]
    return []


def _init_function(module, rope_type: str):
    """The function HF's rotary embedding `module` builds a table of `rope_type` with: its own
    default, or its modeling file's ROPE_INIT_FUNCTIONS; None where it has none."""
    import sys
    if rope_type == "default":
        return getattr(type(module), "compute_default_rope_parameters", None)
    return getattr(sys.modules.get(type(module).__module__), "ROPE_INIT_FUNCTIONS", {}).get(rope_type)


def _rope_init(module):
    """The function HF's rotary embedding `module` built its one table with (its config's rope
    type), or None where it is not one."""
    config = getattr(module, "config", None)
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) or "rope_type" not in rope or not hasattr(module, "inv_freq") \
            or not hasattr(module, "attention_scaling"):
        return None
    return _init_function(module, rope["rope_type"])


def _tables_per_type(module) -> dict:
    """HF 5's rotary embedding holding one table per layer type (its config's rope_parameters keyed
    by layer type, each table in `<type>_inv_freq` and `<type>_attention_scaling`, the type passed
    with each call): layer type -> (its rope parameters, the function its table is built with).
    Empty for a module with one table."""
    config = getattr(module, "config", None)
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) or "rope_type" in rope:
        return {}
    out = {}
    for layer_type, params in rope.items():
        if isinstance(params, dict) and "rope_type" in params and hasattr(module, f"{layer_type}_inv_freq") \
                and hasattr(module, f"{layer_type}_attention_scaling"):
            init = _init_function(module, params["rope_type"])
            if init is not None:
                out[layer_type] = (params, init)
    return out


def _said(params: dict, names) -> str:
    return ", ".join(f"{name} {params.get(name)!r}" for name in names)


def check_rotary_per_type(ctx) -> list[Diagnosis]:
    """A rotary embedding with one table per layer type (HF 5's Gemma 3: full and sliding attention)
    whose table is torch's table of one type built with other parameters: another layer type's, or
    the paddle model's config's (its one value for every type, or its entry for that type). Each
    type is tried, since the call says which table it reads."""
    tables = _tables_per_type(ctx.torch_module)
    if not tables:
        return []
    p_rope = getattr(getattr(ctx.paddle_layer, "config", None), "rope_parameters", None)
    p_rope = p_rope if isinstance(p_rope, dict) else {}
    flat = {k: v for k, v in p_rope.items() if not isinstance(v, dict) and k != "rope_type"}
    for layer_type, (mine, rope_init) in tables.items():
        for other, (params, _) in tables.items():
            differ = sorted(k for k in set(mine) | set(params) if k != "rope_type" and mine.get(k) != params.get(k))
            if other == layer_type or not differ or params.get("rope_type") != mine.get("rope_type"):
                continue
            if _what_if(ctx, lambda m, t=layer_type, i=rope_init, p=params: _rope_built_from(m, i, {t: dict(p)}, t)):
                also = [k for k in differ if k in flat and flat[k] == params.get(k)]
                held = (f"; the paddle model's config holds {_said(flat, also)} as its rope_parameters for every "
                        "layer type, beside the per-type entries" if also else "")
                return [Diagnosis(ctx.name, f"the {layer_type} rotary table is built with the {other} layers' rope "
                                  f"parameters: {', '.join(f'{k} {params.get(k)!r} instead of {mine.get(k)!r}' for k in differ)}"
                                  f"{held}",
                                  f"build each layer type's table from its own rope_parameters entry and give each "
                                  f"layer its type's table ({layer_type}: {_said(mine, differ)}; {other}: "
                                  f"{_said(params, differ)}), as torch's model does", kind="rotary")]
        own = p_rope.get(layer_type) if isinstance(p_rope.get(layer_type), dict) else {}
        for source, values in (("rope_parameters", flat), (f"rope_parameters['{layer_type}']", own)):
            for name in sorted(k for k in values if k in mine and k != "rope_type" and values[k] != mine[k]):
                changed = dict(mine, **{name: values[name]})
                if _what_if(ctx, lambda m, t=layer_type, i=rope_init, p=changed: _rope_built_from(m, i, {t: dict(p)}, t)):
                    return [Diagnosis(ctx.name, f"the {layer_type} rotary table is torch's built with the paddle "
                                      f"model's {source}['{name}'] {values[name]!r}; torch's config has {mine[name]!r} "
                                      f"for {layer_type}",
                                      f"build the paddle model's {layer_type} table from {name} {mine[name]!r}",
                                      kind="rotary")]
    return []


@contextlib.contextmanager
def _rope_built_from(module, rope_init, changes: dict, layer_type: str | None = None):
    """The rotary table of `module` (of its `layer_type`, where it holds one per type) rebuilt from
    its config with `changes` made to its rope_parameters (max_position_embeddings: to the config
    itself)."""
    import copy
    config = copy.deepcopy(module.config)
    config.rope_parameters = dict(config.rope_parameters)
    for name, value in changes.items():
        if name == "max_position_embeddings":
            config.max_position_embeddings = value
        else:
            config.rope_parameters[name] = value
    prefix = f"{layer_type}_" if layer_type else ""
    held = getattr(module, f"{prefix}inv_freq"), getattr(module, f"{prefix}attention_scaling")
    typed = {"layer_type": layer_type} if layer_type else {}
    inv_freq, scaling = rope_init(config, held[0].device, **typed)
    setattr(module, f"{prefix}inv_freq", inv_freq.to(held[0].dtype))
    setattr(module, f"{prefix}attention_scaling", scaling)
    try:
        yield
    finally:
        setattr(module, f"{prefix}inv_freq", held[0])
        setattr(module, f"{prefix}attention_scaling", held[1])


def check_rotary(ctx) -> list[Diagnosis]:
    """A rotary table that is torch's built from other rope parameters: the paddle model's value of
    a rotary field that differs from torch's config, or YaRN's factor taken as
    max_position_embeddings / original_max_position_embeddings instead of rope_parameters' factor
    (PaddleFormers 1.2 reads it so whenever original_max_position_embeddings is given)."""
    rope_init = _rope_init(ctx.torch_module)
    if rope_init is None:
        return []
    config = ctx.torch_module.config
    rope = config.rope_parameters
    mine = dict(rope, max_position_embeddings=getattr(config, "max_position_embeddings", None))
    p_config = getattr(ctx.paddle_layer, "config", None)
    p_rope = getattr(p_config, "rope_parameters", None)
    theirs = dict(p_rope if isinstance(p_rope, dict) else {},
                  max_position_embeddings=getattr(p_config, "max_position_embeddings", None))
    for name in sorted(set(mine) & set(theirs)):
        if theirs[name] is None or theirs[name] == mine[name] or name == "rope_type":
            continue
        changes = {name: theirs[name]}
        if _what_if(ctx, lambda m, c=changes: _rope_built_from(m, rope_init, c)):
            field = name if name == "max_position_embeddings" else f"rope_parameters['{name}']"
            return [Diagnosis(ctx.name, f"the rotary table is torch's built with the paddle model's {field} "
                              f"{theirs[name]!r}; torch's config has {mine[name]!r}",
                              f"give the paddle model's config torch's {field} ({mine[name]!r})", kind="rotary")]
    # the longest context as the paddle model's config says (it reads the factor from its own), else as torch's
    original, factor = rope.get("original_max_position_embeddings"), rope.get("factor")
    longest = theirs["max_position_embeddings"] or mine["max_position_embeddings"]
    if rope["rope_type"] == "yarn" and original and longest and factor is not None and longest / original != factor:
        ratio = longest / original
        if _what_if(ctx, lambda m: _rope_built_from(m, rope_init, {"factor": ratio})):
            whose = "the paddle model's " if theirs["max_position_embeddings"] else ""
            return [Diagnosis(ctx.name, f"the rotary table is torch's with YaRN's factor taken as {whose}"
                              f"max_position_embeddings / original_max_position_embeddings ({longest} / {original} = "
                              f"{ratio:g}) instead of rope_parameters['factor'] ({factor:g}): PaddleFormers 1.2 reads "
                              "the factor so whenever original_max_position_embeddings is given",
                              f"set max_position_embeddings to factor x original_max_position_embeddings "
                              f"({factor * original:g}) in both configs, so the two readings agree", kind="rotary")]
    return []


def check_mask(ctx) -> list[Diagnosis]:
    """A mask on paddle's side that masks positions torch's call does not mask (a causal mask is
    the attention's own business: torch's may apply it inside; check_attention sees to it)."""
    from ..frameworks import paddle_side, torch_side
    from ..compare.capture import call_tensors
    from ..compare.matching import is_causal, masked_positions, same_mask
    if ctx.t_call is None or ctx.p_call is None:
        return []
    t_in = [torch_side.to_numpy(t) for t in call_tensors(ctx.t_call.args, ctx.t_call.kwargs, torch_side.is_tensor)]
    for v in call_tensors(ctx.p_call.args, ctx.p_call.kwargs, paddle_side.is_tensor):
        a = paddle_side.to_numpy(v)
        masked = masked_positions(a)
        if masked is None or is_causal(masked) or any(same_mask(a, t) or _same_as_keep_mask(masked, t) for t in t_in):
            continue
        from .counterfactual_inputs import input_form_causes
        read = input_form_causes(ctx)  # torch's mask read the other way round (True = masked), confirmed
        if read:
            return read
        where = np.argwhere(masked)
        return [Diagnosis(ctx.name, f"paddle's layer receives a mask [{'x'.join(map(str, a.shape))}] that masks "
                          f"{int(masked.sum())} position(s) (first at index {tuple(int(i) for i in where[0])}) where "
                          "torch's call masks none of them",
                          "give both models the same attention_mask; PaddleNLP models build one from pad_token_id "
                          "when none is given, so tokens equal to pad_token_id are masked on paddle's side only", kind="mask")]
    return []


def _same_as_keep_mask(masked: np.ndarray, t: np.ndarray) -> bool:
    """Whether torch's input `t` is a keep-mask of 1s and 0s (HF's 2-D attention_mask, integer or
    float: 0 masks a position) masking the positions `masked` masks, along its last axes."""
    from ..compare.matching import common_shape
    if t.ndim < 2 or t.dtype == np.bool_ or not np.issubdtype(t.dtype, np.number) or t.size == 0 \
            or not np.all((t == 0) | (t == 1)):
        return False
    dropped = t == 0
    if dropped.ndim < masked.ndim:  # [B, T] against [B, 1, 1, T] or [B, 1, T, T]: per batch, per key
        dropped = dropped.reshape(dropped.shape[:1] + (1,) * (masked.ndim - dropped.ndim) + dropped.shape[1:])
    if common_shape(dropped.shape, masked.shape) is None:
        return False
    dropped, masked = np.broadcast_arrays(dropped, masked)
    return bool(np.array_equal(dropped, masked))


def check_tied(ctx) -> list[Diagnosis]:
    """A weight torch shares with another module (a tied output head) that paddle's layer no
    longer shares: none of paddle's weights there holds its values (in either layout)."""
    shared = {}
    for name, p in ctx.session.torch_model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(name)
    prefix = ctx.result.torch
    out = []
    paddle_weights = [w.numpy() for w in ctx.paddle_layer.parameters() if w.ndim == 2]
    for names in shared.values():
        mine = [n for n in names if not prefix or n.startswith(prefix + ".")]
        others = [n for n in names if n not in mine]
        if not mine or not others:
            continue
        w = ctx.session.torch_model.get_parameter(mine[0]).detach().cpu().numpy()
        if any(a.shape == w.shape and np.array_equal(a, w) or a.shape == w.T.shape and np.array_equal(a, w.T)
               for a in paddle_weights):
            continue
        out.append(Diagnosis(ctx.name, f"torch ties '{mine[0]}' to '{others[0]}' (one tensor), but paddle's "
                             f"{ctx.result.paddle or 'model'} holds a weight of its own that differs",
                             "tie the paddle head to the embedding (pass the embedding's weight to it) or copy it "
                             "after loading", kind="tied weights"))
    return out


def _routing(call):
    """(hidden states, chosen experts, routing weights) of an experts call: the first floating
    tensor, then an integer and a floating tensor of one shape [tokens, k]; None otherwise."""
    import torch
    from ..compare.capture import call_tensors
    tensors = call_tensors(call.args, call.kwargs, torch.is_tensor)
    if len(tensors) != 3:
        return None
    hidden, chosen, weights = tensors
    if not (hidden.is_floating_point() and weights.is_floating_point()) or chosen.is_floating_point() \
            or chosen.dim() != 2 or chosen.shape != weights.shape or hidden.dim() != 2 \
            or hidden.shape[0] != chosen.shape[0]:
        return None
    return hidden, chosen, weights


def check_routing_weights(ctx) -> list[Diagnosis]:
    """An experts module of HF 5's form (all experts of a layer in one module with `num_experts`,
    called with the hidden states [tokens, hidden], each token's chosen experts [tokens, k] and
    their weights [tokens, k]) where paddle's output is torch's with the routing weights, scattered
    to [tokens, experts], read as [experts, tokens] (the same values, reshaped rather than transposed: a batched path that runs
    every expert on every token, as PaddleFormers 1.2's GPT-OSS experts in eval mode with
    `transpose([0, 1])`, the identity permutation). Re-run on the recorded inputs with every expert
    chosen for every token, weighted so."""
    import torch
    from ..compare.capture import Call, replace_call_tensors
    experts = getattr(ctx.torch_module, "num_experts", None)
    call = ctx.t_call
    if call is None or not isinstance(experts, int):
        return []
    routing = _routing(call)
    if routing is None:
        return []
    _, chosen, weights = routing
    tokens = chosen.shape[0]
    if tokens < 2 or int(chosen.max()) >= experts:
        return []
    scattered = torch.zeros(tokens, experts, dtype=weights.dtype).scatter(1, chosen.long().cpu(), weights.cpu())
    read = scattered.reshape(experts, tokens).T.contiguous()  # [tokens, experts]: row t holds flat[e * T + t]
    every = torch.arange(experts, dtype=chosen.dtype).expand(tokens, experts).contiguous()
    args, kwargs = replace_call_tensors(call.args, call.kwargs, torch.is_tensor, {1: every, 2: read})
    if not _what_if(ctx, lambda m: contextlib.nullcontext(), Call(call.path, call.type, call.start, call.end, args, kwargs)):
        return []
    return [Diagnosis(ctx.name, f"the routing weights are applied to other tokens: paddle's output is torch's with "
                      f"each token's weights scattered to [tokens, experts] ({tokens} x {experts}) and then read as "
                      f"[experts, tokens] (reshaped, not transposed), so token t gets the weights at positions "
                      f"e x {tokens} + t of the token-major values",
                      "transpose the routing weights to [experts, tokens] before weighing each expert's output "
                      "(paddle's transpose takes a permutation: [1, 0], not [0, 1], which changes nothing)",
                      kind="routing weights")]


CHECKS = (check_mask, check_attention, check_rotary, check_rotary_per_type, check_routing_weights, check_tied)
