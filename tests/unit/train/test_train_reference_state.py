"""The optimizer check's float64 reference and its what-ifs load the optimizer state a teacher-forced
step starts from: torch keeps a loaded step count as it is given and adds to it in place, so each
loads a state of its own, and the state the step starts from (which paddle's step reads beside the
reference, on another thread) stays as it was."""

import copy

import pytest
import torch

from converter.train.optimizer_check import own_state


def _trained(opt_class, **settings):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    opt = opt_class(model.parameters(), **settings)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
    return model, opt


def _tensors(state: dict) -> list:
    return [(i, k, v) for i, s in state["state"].items() for k, v in s.items() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("opt_class, settings", [(torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
                                                 (torch.optim.RMSprop, {"lr": 1e-2, "momentum": 0.9}),
                                                 (torch.optim.Adagrad, {"lr": 1e-2})])
def test_a_float64_step_from_the_state_leaves_the_state_as_it_was(opt_class, settings):
    model, opt = _trained(opt_class, **settings)
    before = copy.deepcopy(opt.state_dict())
    kept = [(i, k, v.clone()) for i, k, v in _tensors(before)]
    assert any(k == "step" for _, k, _ in kept)  # a step count is among what is loaded
    ref = copy.deepcopy(model).double()
    ref_opt = opt_class(ref.parameters(), **settings)
    for _ in range(2):  # the reference, then a what-if, from the same state
        ref_opt.load_state_dict(own_state(before, torch.float64))
        for p in ref.parameters():
            p.grad = torch.ones_like(p)
        ref_opt.step()
    for (i, k, v), (_, _, was) in zip(_tensors(before), kept):
        assert v.dtype == was.dtype and torch.equal(v, was), (i, k)
    steps = [float(s["step"]) for s in ref_opt.state.values()]
    assert steps == [float(before["state"][0]["step"]) + 1] * len(steps)  # the reference counted its own step


def test_the_state_loaded_holds_the_values_of_the_state_in_the_reference_dtype():
    _, opt = _trained(torch.optim.AdamW, lr=1e-2)
    before = opt.state_dict()
    own = own_state(before, torch.float64)
    assert own["param_groups"] == before["param_groups"]
    for (i, k, v), (_, _, o) in zip(_tensors(before), _tensors(own)):
        assert o is not v
        assert o.dtype == (v.dtype if k == "step" else torch.float64), (i, k)
        assert torch.equal(o, v.to(o.dtype)), (i, k)
