"""The binary search's probes read the float64 paddle copy's outputs (paddle's own drift, where a
budget that takes paddle's drift to be torch's is exceeded) at every unit from one pass of the
copy where they fit beside the units' boundaries in the capture limit, and one pass per probe
where they do not; the probes' rows are the same either way. The pair is the Llama-shaped one
4096 wide with bf16-valued weights, whose paddle side drifts further than torch's."""

import numpy as np
import pytest

from converter.compare.session import Options, PortSession
from converter.spec import spec_from_functions
from converter.verify.endtoend import PADDLE_DRIFT
from converter.verify.full import _capture
from converter.verify.strategies import BinarySearch

from helpers.wide_llama import L, bf16_valued, wide_shape  # noqa: F401 - wide_shape: the fixture, found by name

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("wide_shape")]


def _search(session, limit, monkeypatch):
    asked = []
    own = session.paddle64_outputs
    monkeypatch.setattr(session, "paddle64_outputs", lambda paths: asked.append(list(paths)) or own(paths))
    search = BinarySearch(limit)
    found = search.run(session)
    monkeypatch.setattr(session, "paddle64_outputs", own)
    return search, found, asked


def test_the_probes_read_paddles_copy_at_every_unit_from_one_pass(monkeypatch):
    with PortSession(spec_from_functions(bf16_valued, L.paddle_model, L.inputs),
                     Options(device="cpu", strategy="binary")) as session:
        search, once, asked_once = _search(session, None, monkeypatch)
        t_calls, _ = _capture(session, keep=False)
        elements = sum(int(np.prod(s)) for u in search.state.units for s in t_calls[u.torch].shapes)
        # the boundaries fit (16 bytes an element in fp32: both sides' float32, the float64 reference's),
        # the copy's outputs beside them (8 more) do not
        _, each, asked_each = _search(session, 20 * elements, monkeypatch)
    assert len(asked_once) == 1 and len(asked_once[0]) == len(search.state.units)
    assert len(asked_each) > 1 and all(len(paths) == 1 for paths in asked_each)
    assert repr(once.outputs) == repr(each.outputs) and PADDLE_DRIFT in once.outputs.note
    assert once.outputs.ratio < 1
