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
token's top-k weights, largest first, which is HF's order (the logits have no counterpart)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import Family, register

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


def _as_numpy(value) -> tuple[np.ndarray, bool]:
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
class RouterReading:
    """How a gate's logits read as a top-k router's outputs: [softmax, top-k weights]."""

    top_k: int
    normalised: bool

    @classmethod
    def of_module(cls, torch_module) -> RouterReading | None:
        top_k = _top_k(torch_module)
        return None if top_k is None else cls(top_k, bool(getattr(torch_module, "norm_topk_prob", True)))

    def of(self, outputs: list) -> list:
        """Paddle's outputs (tensors or numpy arrays) as torch's router returns them; other than
        one output of at least top_k experts, as they are."""
        if len(outputs) != 1 or not outputs[0].shape or outputs[0].shape[-1] < self.top_k:
            return outputs
        logits, as_paddle = _as_numpy(outputs[0])
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
class ScatteredTopK:
    """How a router's weights scattered to [tokens, experts] (zero where an expert is not chosen)
    read as its top-k weights, largest first: [top-k weights]."""

    top_k: int

    @classmethod
    def of_module(cls, torch_module) -> ScatteredTopK | None:
        top_k = _top_k(torch_module)
        return None if top_k is None else cls(top_k)

    def of(self, outputs: list) -> list:
        """Paddle's outputs as torch's router's top-k weights; other than one floating output of
        at least top_k experts, as they are."""
        floating = [o for o in outputs if "float" in str(o.dtype)]
        if len(floating) != 1 or not floating[0].shape or floating[0].shape[-1] < self.top_k:
            return outputs
        x, as_paddle = _as_numpy(floating[0])
        return _like([_largest(x, self.top_k)], as_paddle)  # the chosen weights are the k largest (softmax: > 0)

    @property
    def note(self) -> str:
        return (f"paddle's router weights, scattered over the experts, read as torch's router returns them: each "
                f"token's top-{self.top_k} weights, largest first (torch's logits have no counterpart)")


register(Family("hf-scattered-topk-router", ("GptOssTopKRouter",), ("GptOssTopKRouter",), paddle_specific=True,
                reads=ScatteredTopK.of_module))
