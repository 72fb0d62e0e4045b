"""One adapter per framework with the same functions: state_dict_infos(model),
to_numpy(tensor) and forward(model, inputs, device). Framework imports stay lazy."""
