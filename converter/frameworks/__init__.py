"""One adapter per framework with the same small set of functions.

`torch_side` and `paddle_side` each provide: state_dict_infos(model),
to_numpy(tensor), layers(model) (named layers in definition order),
precision_state(), and set_eval(model). Framework imports stay lazy.
"""
