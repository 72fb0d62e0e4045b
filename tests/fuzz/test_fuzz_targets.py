"""The atheris fuzz targets (scripts/fuzz_readers.py) run on their seed corpus and on
deterministic damage to it (truncations, flipped bytes), without atheris: the targets stay
working, and every input the fuzzer once found stays fixed."""

import os
import random
import sys

import pytest

from helpers.cli import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import fuzz_readers  # noqa: E402


def _damaged(data: bytes, rng: random.Random):
    yield data
    for cut in sorted({0, 1, 8, len(data) // 2, max(len(data) - 1, 0)}):
        yield data[:cut]
    for _ in range(40):
        raw = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            if raw:
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        yield bytes(raw)


@pytest.mark.parametrize("name", sorted(fuzz_readers.TARGETS))
def test_fuzz_target_on_its_corpus(name):
    directory = os.path.join(fuzz_readers.CORPUS, name)
    seeds = sorted(os.listdir(directory))
    assert seeds, name
    rng = random.Random(0)
    for seed in seeds:
        with open(os.path.join(directory, seed), "rb") as f:
            data = f.read()
        for case in _damaged(data, rng):
            fuzz_readers.TARGETS[name](case)  # a UserError is caught inside; anything else fails here
