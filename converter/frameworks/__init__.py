"""One adapter per framework with the same functions: state_dict_infos(model),
to_numpy(tensor), forward(model, inputs, device), is_tensor(value), is_float_tensor(value),
named_layers(model) and add_hooks(layer, pre, post, first). Framework imports stay lazy.
`FrameworkAdapter` spells out that contract; the modules torch_side and paddle_side each meet it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Union

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only
    import numpy as np

    from ..io.base import TensorInfo

# the spec's inputs: keyword arrays, or positional ones
Inputs = Union["dict[str, np.ndarray]", "tuple[np.ndarray, ...]"]
# pre(layer, args, kwargs) -> None or new (args, kwargs); post(layer, args, output)
PreHook = Callable[[Any, tuple, dict], Any]
PostHook = Callable[[Any, tuple, Any], Any]


class FrameworkAdapter(Protocol):
    """What verification asks of a framework; a module of functions (torch_side, paddle_side) is
    one. `model` and `layer` are that framework's modules (torch.nn.Module, paddle.nn.Layer)."""

    def state_dict_infos(self, model: Any) -> dict[str, TensorInfo]:
        """Name, dtype and shape of every entry of the model's state dict."""

    def to_numpy(self, tensor: Any) -> np.ndarray:
        """A tensor as numpy on the CPU; floating tensors narrower than float32 widened to float32."""

    def is_tensor(self, value: Any) -> bool: ...

    def is_float_tensor(self, value: Any) -> bool: ...

    def named_layers(self, model: Any) -> list[tuple[str, Any]]:
        """(path, layer) for the model and every layer inside it, the model's path being ""."""

    def add_hooks(self, layer: Any, pre: PreHook | None = None, post: PostHook | None = None,
                  first: bool = False) -> list:
        """Hooks on one layer; the handles, to remove them."""

    def forward(self, model: Any, inputs: Inputs, device: str) -> Any:
        """The model on the spec's inputs, without gradients."""


def hooks(layer: Any, pre: PreHook | None, post: PostHook | None, first: bool, post_method: str) -> list:
    """pre(layer, args, kwargs) may return new (args, kwargs); post(layer, args, output).
    `first` puts the pre-hook before those already there. The frameworks differ only in the
    name of the method that adds a post-hook."""
    handles = []
    if pre is not None:
        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True, prepend=first))
    if post is not None:
        handles.append(getattr(layer, post_method)(post))
    return handles
