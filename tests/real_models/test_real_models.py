"""verify-port on real model pairs: HF transformers models against PaddleNLP 2.8.1's ports.

Every clean pair passes under each strategy; every planted bug is named at its module, with
its diagnosis under auto and full. A case whose answer a known verifier defect spoils is a
strict expected failure under the strategies it spoils, with the defect as its reason: it
turns red once the defect is fixed, so that its mark is taken away. Runs only where transformers and PaddleNLP are installed
(the side environment that scripts/side_env.sh builds); elsewhere it is skipped.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

pytest.importorskip("transformers")
pytest.importorskip("paddlenlp")

from cases import CASES  # noqa: E402
from runner import STRATEGIES, command_line, run_case  # noqa: E402

RUNS = [pytest.param(case, strategy, id=f"{case.name}-{strategy}",
                     marks=[pytest.mark.xfail(strict=True, reason=case.defect(strategy).what)] if case.defect(strategy)
                     else [])
        for case in CASES for strategy in STRATEGIES if strategy in case.strategies]


@pytest.mark.parametrize("case,strategy", RUNS)
def test_real_pair(case, strategy):
    outcome = run_case(case, strategy)
    assert not outcome.problems(), (f"{command_line(case, strategy)}: {'; '.join(outcome.problems())}; "
                                    f"diagnosis {outcome.causes}; notes {outcome.notes[:3]}")


def test_the_hf_layer_families_name_classes_transformers_has():
    """The layer families keyed by HF transformers' own class names name real classes."""
    import torch
    import transformers.activations
    import transformers.pytorch_utils

    from converter.families import REGISTRY
    hf = {t: f for t, f in REGISTRY.items() if f.name.startswith("hf-")}
    assert hf, "no hf- family registered"
    for torch_type, family in hf.items():
        cls = getattr(transformers.activations, torch_type, None) or getattr(transformers.pytorch_utils, torch_type, None)
        assert isinstance(cls, type) and issubclass(cls, torch.nn.Module), (family.name, torch_type)
