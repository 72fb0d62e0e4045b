"""One adapter per framework with the same functions: state_dict_infos(model),
to_numpy(tensor), forward(model, inputs, device), is_tensor(value), is_float_tensor(value),
named_layers(model) and add_hooks(layer, pre, post, first). Framework imports stay lazy."""
