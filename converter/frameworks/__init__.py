"""One adapter per framework with the same functions: state_dict_infos(model),
to_numpy(tensor), forward(model, inputs, device), is_tensor(value), is_float_tensor(value),
named_layers(model) and add_hooks(layer, pre, post, first). Framework imports stay lazy."""


def hooks(layer, pre, post, first: bool, post_method: str) -> list:
    """pre(layer, args, kwargs) may return new (args, kwargs); post(layer, args, output).
    `first` puts the pre-hook before those already there. The frameworks differ only in the
    name of the method that adds a post-hook."""
    handles = []
    if pre is not None:
        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True, prepend=first))
    if post is not None:
        handles.append(getattr(layer, post_method)(post))
    return handles
