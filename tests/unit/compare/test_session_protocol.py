"""The Session protocol the forward check's functions annotate with is what a set-up PortSession
has: every attribute it declares is set, every method it declares is there (a member added to
one and not the other fails here)."""

import inspect

import numpy as np
import paddle
import torch

from converter.compare.port import Session
from converter.compare.session import Options, PortSession
from converter.spec import spec_from_functions


def _declared(protocol) -> set:
    members = set(protocol.__annotations__)
    members |= {name for name, value in vars(protocol).items()
                if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}
    return members


def test_a_set_up_port_session_has_every_member_the_protocol_declares():
    def torch_model():
        torch.manual_seed(0)
        return torch.nn.Linear(3, 2).eval()
    spec = spec_from_functions(torch_model, lambda: paddle.nn.Linear(3, 2), lambda: (np.ones((1, 3), "float32"),))
    declared = _declared(Session)
    assert {"torch_model", "paddle_layer", "skip", "formats", "streams"} <= declared
    with PortSession(spec, Options()) as session:
        missing = sorted(name for name in declared if not hasattr(session, name))
        assert missing == []
        for name in declared:
            if inspect.isfunction(vars(Session).get(name)):
                assert callable(getattr(session, name)), name
