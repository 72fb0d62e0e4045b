"""Mixture-of-experts routers: HF's top-k routers against a paddle port's gate Linear.

HF 5's top-k router (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE, ...) returns the softmax over the
experts and each token's top-k weights (normalised to sum to one where the model says so),
computed in float32. A paddle port's gate (PaddleFormers' `gate`, a Linear) returns the logits
and leaves softmax and top-k to its block. Paddle's output is read as torch's router returns it,
the softmax of its logits and their top-k weights, so the two are compared by what they mean:
the form is never a difference, a wrong weight or bias still is.

GPT-OSS's router (HF 5 and PaddleFormers alike: top-k of the logits, then a softmax over those k)
returns on HF's side the logits, the top-k weights and their experts, on PaddleFormers' the weights
scattered to [tokens, experts] and the experts: the scattered weights are read back as each
token's top-k weights, largest first, which is HF's order (the logits have no counterpart).

DeepSeek-V3's and GLM-4-MoE's grouped routers return on HF 5's side the logits only (the MoE
block routes: sigmoid scores, the score-correction bias added for the choice, the best groups,
the top-k experts of those, their scores normalised and scaled); PaddleFormers' router does the
routing itself and returns the chosen experts and their weights. Neither form gives the other
(the logits of experts not chosen are gone), so both are read as the routing: HF's logits routed
as its block routes them, with the router's own bias and the model's settings, and each side's
weights taken largest first (the chosen experts are integers, which are not recorded: a wrong
choice shows in the weights, which are the chosen experts' scores)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import Family, OutputReading, register
from .norm import sigmoid

# HF transformers 5's routers of this form: softmax over the experts, then top-k (norm_topk_prob
# where the class has it; the others always normalise)
TOPK_ROUTERS = ("Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "Qwen3NextTopKRouter", "Qwen3_5MoeTopKRouter",
                "Qwen3VLMoeTextTopKRouter", "MixtralTopKRouter", "MiniMaxTopKRouter", "OlmoeTopKRouter",
                "FlexOlmoTopKRouter")


def _top_k(torch_module) -> int | None:
    """The router's k (its `top_k`), or None where it has none."""
    top_k = getattr(torch_module, "top_k", None)
    return top_k if isinstance(top_k, int) and top_k >= 1 else None


def _largest(x: np.ndarray, k: int) -> np.ndarray:
    """The k largest values along the last axis, largest first (torch.topk's values)."""
    return np.ascontiguousarray(-np.sort(-x, axis=-1)[..., :k])


def as_numpy(value) -> tuple[np.ndarray, bool]:
    """(value as numpy, whether it was a paddle tensor): readings take either and give back the same."""
    if isinstance(value, np.ndarray):
        return value, False
    narrow = str(value.dtype).rpartition(".")[2] in ("float16", "bfloat16")  # numpy has no bfloat16
    return (value.astype("float32") if narrow else value).numpy(), True


def _like(arrays: list, as_paddle: bool) -> list:
    if not as_paddle:
        return arrays
    import paddle
    return [paddle.to_tensor(a) for a in arrays]


@dataclass(frozen=True)
class RouterReading(OutputReading):
    """How a gate's logits read as a top-k router's outputs: [softmax, top-k weights]."""

    top_k: int
    normalised: bool

    @classmethod
    def of_module(cls, torch_module, paddle_layer=None) -> RouterReading | None:
        top_k = _top_k(torch_module)
        return None if top_k is None else cls(top_k, bool(getattr(torch_module, "norm_topk_prob", True)))

    def of(self, outputs: list) -> list:
        """Paddle's outputs (tensors or numpy arrays) as torch's router returns them; other than
        one output of at least top_k experts, as they are."""
        if len(outputs) != 1 or not outputs[0].shape or outputs[0].shape[-1] < self.top_k:
            return outputs
        logits, as_paddle = as_numpy(outputs[0])
        x = logits.astype(np.float64)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        probs = e / e.sum(axis=-1, keepdims=True)
        top = _largest(probs, self.top_k)
        if self.normalised:
            top = top / top.sum(axis=-1, keepdims=True)
        dtype = np.float32 if as_paddle else np.result_type(logits.dtype, np.float32)  # float64 stays float64
        return _like([probs.astype(dtype), top.astype(dtype)], as_paddle)

    @property
    def note(self) -> str:
        weights = "normalised top-%d weights" % self.top_k if self.normalised else "top-%d weights" % self.top_k
        return f"paddle's gate logits read as torch's router returns them: their softmax, then its {weights}"


register(Family("hf-topk-router", TOPK_ROUTERS, ("Linear",), paddle_specific=True, reads=RouterReading.of_module))


@dataclass(frozen=True)
class ScatteredTopK(OutputReading):
    """How a router's weights scattered to [tokens, experts] (zero where an expert is not chosen)
    read as its top-k weights, largest first: [top-k weights]."""

    top_k: int

    @classmethod
    def of_module(cls, torch_module, paddle_layer=None) -> ScatteredTopK | None:
        top_k = _top_k(torch_module)
        return None if top_k is None else cls(top_k)

    def of(self, outputs: list) -> list:
        """Paddle's outputs as torch's router's top-k weights; other than one floating output of
        at least top_k experts, as they are."""
        floating = [o for o in outputs if "float" in str(o.dtype)]
        if len(floating) != 1 or not floating[0].shape or floating[0].shape[-1] < self.top_k:
            return outputs
        x, as_paddle = as_numpy(floating[0])
        return _like([_largest(x, self.top_k)], as_paddle)  # the chosen weights are the k largest (softmax: > 0)

    @property
    def note(self) -> str:
        return (f"paddle's router weights, scattered over the experts, read as torch's router returns them: each "
                f"token's top-{self.top_k} weights, largest first (torch's logits have no counterpart)")


register(Family("hf-scattered-topk-router", ("GptOssTopKRouter",), ("GptOssTopKRouter",), paddle_specific=True,
                reads=ScatteredTopK.of_module))


@dataclass(frozen=True)
class GroupedRouting(OutputReading):
    """How a grouped router's outputs read as its routing weights, largest first: [top-k weights].
    HF's logits are routed as its MoE block routes them (`of_torch`); paddle's router returns the
    routing weights already (`of`)."""

    top_k: int
    n_group: int
    topk_group: int
    normalised: bool
    scale: float
    bias: tuple[float, ...]  # the router's e_score_correction_bias, as torch holds it
    reads_torch = True

    @classmethod
    def of_module(cls, torch_module, paddle_layer=None) -> GroupedRouting | None:
        """From the torch router and its model's config (DeepSeek-V3's router holds the weight and
        bias only: its block reads the rest from the same config)."""
        config = getattr(torch_module, "config", None)
        bias = getattr(torch_module, "e_score_correction_bias", None)
        fields = {name: getattr(config, name, None) for name in ("num_experts_per_tok", "n_group", "topk_group",
                                                                  "norm_topk_prob", "routed_scaling_factor")}
        if bias is None or bias.is_meta or any(v is None for v in fields.values()):
            return None  # (a model on the meta device, its weights streamed, has no bias to read yet)
        experts = int(bias.numel())
        if fields["num_experts_per_tok"] > experts or experts % fields["n_group"]:
            return None
        return cls(int(fields["num_experts_per_tok"]), int(fields["n_group"]), int(fields["topk_group"]),
                   bool(fields["norm_topk_prob"]), float(fields["routed_scaling_factor"]),
                   tuple(float(b) for b in bias.detach().cpu().double().numpy()))

    def of(self, outputs: list) -> list:
        """Paddle's routing weights, largest first; other than one floating output of top_k
        weights per token, as they are."""
        floating = [o for o in outputs if "float" in str(o.dtype)]
        if len(floating) != 1 or not floating[0].shape or floating[0].shape[-1] != self.top_k:
            return outputs
        x, as_paddle = as_numpy(floating[0])
        return _like([_largest(x, self.top_k)], as_paddle)

    def of_torch(self, outputs: list) -> list:
        """torch's router logits ([tokens, experts], tensors or numpy arrays) routed as HF's block
        routes them, in their own precision: each token's top_k weights, largest first; other than
        one output of as many experts as the bias, as they are."""
        if len(outputs) != 1 or not outputs[0].shape or outputs[0].shape[-1] != len(self.bias):
            return outputs
        value = outputs[0]
        as_torch = not isinstance(value, np.ndarray)
        logits = value.detach().cpu().float().numpy() if as_torch and value.dtype.itemsize < 4 else \
            value.detach().cpu().numpy() if as_torch else value
        weights = self.route(logits.reshape(-1, len(self.bias)))
        if as_torch:
            import torch
            return [torch.from_numpy(weights)]
        return [weights]

    def route(self, logits: np.ndarray) -> np.ndarray:
        """[tokens, top_k] routing weights, largest first, from [tokens, experts] logits, computed in
        the logits' precision: sigmoid scores; the bias added for the choice; per group the sum of
        its two best; the topk_group best groups; the top_k experts of those (the others' choice
        scores 0, as HF masks them); their scores, normalised where the model says, then scaled."""
        dtype = np.float64 if logits.dtype == np.float64 else np.float32
        x = logits.astype(dtype, copy=False)
        scores = sigmoid(x)
        choice = scores + np.asarray(self.bias, dtype=dtype)
        tokens, experts = choice.shape
        groups = choice.reshape(tokens, self.n_group, experts // self.n_group)
        group_scores = np.sort(groups, axis=-1)[..., -2:].sum(axis=-1)
        best = np.argsort(-group_scores, axis=-1, kind="stable")[:, :self.topk_group]
        kept = np.zeros((tokens, self.n_group), dtype=bool)
        np.put_along_axis(kept, best, True, axis=-1)
        choice = np.where(np.repeat(kept, experts // self.n_group, axis=-1), choice, dtype(0))
        chosen = np.argsort(-choice, axis=-1, kind="stable")[:, :self.top_k]
        weights = np.take_along_axis(scores, chosen, axis=-1)
        if self.normalised:
            weights = weights / (weights.sum(axis=-1, keepdims=True) + dtype(1e-20))
        return _largest((weights * dtype(self.scale)).astype(dtype), self.top_k)

    @property
    def note(self) -> str:
        groups = f"the best {self.topk_group} of {self.n_group} groups, " if self.n_group > 1 else ""
        normalised = "normalised, " if self.normalised else ""
        return (f"compared as the routing: torch's router logits routed as its block routes them (sigmoid scores, the "
                f"score-correction bias for the choice, {groups}top-{self.top_k}, {normalised}scaled by "
                f"{self.scale:g}) against paddle's routing weights, each token's top-{self.top_k} weights largest first")


# HF transformers 5's grouped routers, each against PaddleFormers 1.2's router of the same name
GROUPED_ROUTERS = ("DeepseekV3TopkRouter", "Glm4MoeTopkRouter")
register(Family("hf-grouped-router", GROUPED_ROUTERS, GROUPED_ROUTERS, paddle_specific=True,
                reads=GroupedRouting.of_module))
