"""The forward check's memory, estimated before it runs (compare/memory.py): both models, the
float64 reference's whole-run part and largest blocks, the activations; a run that cannot fit
stops with one line, one that fits narrowly says so in the report."""

import pytest
import torch

from converter.compare.session import Options, PortSession
from converter.errors import UserError
from converter.examples import bert_port
from converter.spec import load_spec
from converter.compare import memory
from converter.verify.run import run_on

GiB = 1 << 30


@pytest.fixture(scope="module")
def session():
    with PortSession(load_spec(bert_port.__file__), Options(device="cpu")) as s:
        yield s


@pytest.fixture(autouse=True)
def two_blocks_kept(session, monkeypatch):
    """Each test starts from the reference's two blocks (memory.check keeps more where there is room)."""
    monkeypatch.setattr(session.reference64.tensors, "keep", 2)


def test_the_estimate_counts_both_models_and_the_reference_held_at_most(session):
    est = memory.estimate(session, 1 << 20)
    torch_bytes = sum(t.numel() * t.element_size() for t in session.torch_model.state_dict(keep_vars=True).values()
                      if t.is_floating_point())
    assert est.models >= 2 * torch_bytes  # the paddle model holds the same weights, in float32 too
    assert est.activations == 2 << 20
    double = 2 * sum(p.numel() * p.element_size() for p in session.torch_model.parameters())
    assert (est.reference, est.blocks) == session.reference64.most_bytes()
    assert 0 < est.reference + est.blocks < double  # two of its layers widened, not the whole model


def test_full_captures_activations_grow_with_the_inputs(session):
    small = memory.estimate(session, None).activations
    inputs = session.inputs
    session.inputs = {k: v.repeat(2, axis=0) for k, v in inputs.items()} if isinstance(inputs, dict) \
        else tuple(v.repeat(2, axis=0) for v in inputs)
    try:
        large = memory.estimate(session, None).activations
    finally:
        session.inputs = inputs
    assert small > 0 and 1.9 * small < large < 2.1 * small


def test_a_run_that_cannot_fit_stops_with_one_line(session, monkeypatch):
    monkeypatch.setattr(session.reference64.tensors, "keep", 1)  # what so little memory leaves it (see below)
    est = memory.estimate(session, 1 << 20)
    monkeypatch.setattr(memory, "available_memory", lambda cap=None: (est.more - 1, "the cgroup's limit (test)"))
    with pytest.raises(UserError) as caught:
        run_on(session, Options(device="cpu", strategy="binary"), capture_limit=1 << 20)
    said = str(caught.value)
    assert "\n" not in said and "give smaller inputs, or free memory" in said and f"{est.peak / GiB:.1f} GiB" in said
    assert "the cgroup's limit (test)" in said


def test_a_run_that_fits_narrowly_says_so_and_an_ample_one_says_nothing(session, monkeypatch):
    limit = 1 << 20
    monkeypatch.setattr(session.reference64.tensors, "keep", 1)  # what so little memory leaves it (see below)
    est = memory.estimate(session, limit)
    monkeypatch.setattr(memory, "available_memory", lambda cap=None: (int(est.more / 0.9), "available memory"))
    notes = memory.check(session, limit)
    assert len(notes) == 1 and notes[0].startswith("memory: the run needs about")
    monkeypatch.setattr(memory, "available_memory", lambda cap=None: (10 * est.more, "available memory"))
    assert memory.check(session, limit) == []


def test_room_to_spare_keeps_more_widened_blocks_and_none_keeps_one(session, monkeypatch):
    limit = 1 << 20
    tensors = session.reference64.tensors
    est = memory.estimate(session, limit)
    monkeypatch.setattr(memory, "available_memory", lambda cap=None: (int(est.more / 0.9), "available memory"))
    memory.check(session, limit)
    assert tensors.keep == 1  # a block is far more than BLOCK_SHARE of so little memory
    monkeypatch.setattr(memory, "available_memory", lambda cap=None: (100 * est.more, "available memory"))
    memory.check(session, limit)
    assert tensors.keep == tensors.blocks > 2


def test_a_block_over_its_share_of_the_memory_is_widened_alone(session):
    tensors = session.reference64.tensors
    block = memory.estimate(session, 0).blocks // 2
    memory.one_block(session, int(block / memory.BLOCK_SHARE) + 1)
    assert tensors.keep == 2
    memory.one_block(session, int(block / memory.BLOCK_SHARE) - 1)
    assert tensors.keep == 1
    assert memory.estimate(session, 0).blocks == block


def test_the_available_memory_is_the_systems_or_less():
    available, source = memory.available_memory()
    with open("/proc/meminfo") as f:
        system = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    assert 0 < available <= system * 1.05 + (64 << 20)  # the system's figure moves between the two reads
    assert source == "available memory" or source.startswith("the cgroup's limit")


def test_the_reference_model_of_the_session_runs_as_a_double_copy(session):
    import copy
    from converter.tree import flatten
    plain = copy.deepcopy(session.torch_model).double()
    inputs = {k: torch.from_numpy(v) for k, v in session.inputs.items()}
    with torch.no_grad():
        got, want = flatten(session.torch64(**inputs), torch.is_tensor), flatten(plain(**inputs), torch.is_tensor)
    assert len(got) == len(want) > 0 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(a.dtype == torch.float64 for a in got)
