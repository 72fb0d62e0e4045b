"""Mixture-of-experts experts: HF 5's experts modules (all experts of a layer in one module, called
with the hidden states [tokens, hidden], each token's chosen experts [tokens, k] and their routing
weights [tokens, k]) against a paddle port's experts layer (PaddleFormers' MoeExperts).

A batched paddle path that runs every expert on every token and weighs the results by the
routing weights scattered to [tokens, experts] needs them as [experts, tokens]: reshaped instead
of transposed (a transpose by the identity permutation, as PaddleFormers 1.2's GPT-OSS experts in
eval mode do with `transpose([0, 1])`), the weights are read token-major as expert-major, and
tokens get other tokens' weights. The what-if re-runs torch's experts on the recorded inputs with
every expert chosen for every token, weighted so."""

from __future__ import annotations

import contextlib

from ..diagnosis import Diagnosis
from . import Family, register

# HF transformers 5's experts modules: forward(hidden_states, top_k_index, top_k_weights)
HF_EXPERTS = ("GptOssExperts", "Qwen2MoeExperts", "Qwen3MoeExperts", "MixtralExperts", "DeepseekV3NaiveMoe",
              "Glm4MoeNaiveMoe")


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


def read_across_tokens(ctx, where, torch_module, paddle_layer) -> list:
    """Paddle's output is torch's with the routing weights, scattered to [tokens, experts], read as
    [experts, tokens] (the same values, reshaped rather than transposed)."""
    import torch
    from ..compare.capture import Call, replace_call_tensors
    from ..verify.diagnose_model import _what_if
    experts = getattr(torch_module, "num_experts", None)
    call = ctx.t_call
    if where != ctx.name or call is None or not isinstance(experts, int):
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
    return [Diagnosis(where, f"the routing weights are applied to other tokens: paddle's output is torch's with "
                      f"each token's weights scattered to [tokens, experts] ({tokens} x {experts}) and then read as "
                      f"[experts, tokens] (reshaped, not transposed), so token t gets the weights at positions "
                      f"e x {tokens} + t of the token-major values",
                      "transpose the routing weights to [experts, tokens] before weighing each expert's output "
                      "(paddle's transpose takes a permutation: [1, 0], not [0, 1], which changes nothing)",
                      kind="routing weights")]


# PaddleFormers 1.2's experts layers derive from MoeExperts
register(Family("hf-experts", HF_EXPERTS, ("MoeExperts",), paddle_specific=True, what_ifs=(read_across_tokens,)))
