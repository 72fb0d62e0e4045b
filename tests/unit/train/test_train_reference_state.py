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


def _steps_from(states: list, model, opt_class, settings, load) -> list:
    """A float64 copy of `model` stepped once from each state of `states` in turn by `load`ing it; what
    each step left: the optimizer's state dict (tensors cloned) and the parameters."""
    ref = copy.deepcopy(model).double()
    ref_opt = opt_class(ref.parameters(), **settings)
    left = []
    for state in states:
        load(ref_opt, state)
        for p in ref.parameters():
            p.grad = torch.ones_like(p)
        ref_opt.step()
        saved = ref_opt.state_dict()
        left.append(({i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                      for i, s in saved["state"].items()}, copy.deepcopy(saved["param_groups"]),
                     [p.detach().clone() for p in ref.parameters()]))
    return left


@pytest.mark.parametrize("opt_class, settings", [(torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
                                                 (torch.optim.Adam, {"lr": 1e-2, "amsgrad": True}),
                                                 (torch.optim.RMSprop, {"lr": 1e-2, "momentum": 0.9, "centered": True}),
                                                 (torch.optim.Adagrad, {"lr": 1e-2}),
                                                 (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9})])
def test_the_state_copied_into_the_reference_steps_as_the_state_loaded(opt_class, settings):
    """load_own_state copies each state into the tensors the reference holds (its first, empty, state
    too): every step leaves what loading own_state's copy leaves, and the states stay as they were."""
    from converter.train.optimizer_check import load_own_state
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    opt = opt_class(model.parameters(), **settings)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # a rate of its own in every state
    states = []
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().sum().backward()
        states.append(copy.deepcopy(opt.state_dict()))
        opt.step()
        sched.step()
    kept = [[(i, k, v.clone()) for i, k, v in _tensors(s)] for s in states]
    loaded = _steps_from(states, model, opt_class, settings,
                         lambda o, s: o.load_state_dict(own_state(s, torch.float64)))
    copied = _steps_from(states, model, opt_class, settings, lambda o, s: load_own_state(o, s, torch.float64))
    for (s_a, g_a, p_a), (s_b, g_b, p_b) in zip(loaded, copied):
        assert g_a == g_b
        assert s_a.keys() == s_b.keys()
        for i in s_a:
            assert s_a[i].keys() == s_b[i].keys()
            for k, a in s_a[i].items():
                b = s_b[i][k]
                assert (a.dtype == b.dtype and torch.equal(a, b)) if isinstance(a, torch.Tensor) else a == b, (i, k)
        assert all(torch.equal(a, b) for a, b in zip(p_a, p_b))
    for state, was in zip(states, kept):
        for (i, k, v), (_, _, w) in zip(_tensors(state), was):
            assert v.dtype == w.dtype and torch.equal(v, w), (i, k)


def test_a_state_of_the_same_form_is_copied_into_the_tensors_the_reference_holds():
    from converter.train.optimizer_check import load_own_state
    model, opt = _trained(torch.optim.AdamW, lr=1e-2)
    state = copy.deepcopy(opt.state_dict())
    ref = copy.deepcopy(model).double()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    load_own_state(ref_opt, state, torch.float64)  # the first: nothing held yet of that form
    held = {id(v) for s in ref_opt.state.values() for v in s.values()}
    load_own_state(ref_opt, state, torch.float64)
    assert {id(v) for s in ref_opt.state.values() for v in s.values()} == held
    params = list(ref.parameters())
    for i, k, v in _tensors(state):
        assert torch.equal(ref_opt.state[params[i]][k], v.to(ref_opt.state[params[i]][k].dtype)), (i, k)
