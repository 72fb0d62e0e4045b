"""verify-port HF_DIR PADDLE_DIR where the run would not fit in memory, on tiny random HF transformers 5
directories (Llama, Qwen3; 3 layers, hidden 256) converted for PaddleFormers 1.2: transformers'
class built from config.json on the meta device (its rotary table computed on the CPU) and
PaddleFormers' under LazyGuard, both streamed block by block from the two directories, give the
in-memory run's rows bit for bit with every loaded weight checked. The memory available is set
between the two estimates (verify/memory.py's available_memory). Runs in the second side
environment (scripts/side_env_paddleformers.sh); elsewhere it is skipped."""

import importlib.util
import json
import sys

import pytest

from helpers.cli import run_convert

if importlib.util.find_spec("paddleformers") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("needs transformers 5 and PaddleFormers (scripts/side_env_paddleformers.sh)", allow_module_level=True)

import torch  # noqa: E402  (before paddleformers, which otherwise hides torch from transformers)

sys.modules["torchcodec"] = None  # paddlecodec's torchcodec has no distribution metadata: transformers trips on it
transformers = pytest.importorskip("transformers")
pytest.importorskip("paddleformers")

SIZES = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=1024,
             num_hidden_layers=3, vocab_size=120, max_position_embeddings=64, tie_word_embeddings=False)
CLASSES = {"LlamaForCausalLM": "LlamaConfig", "Qwen3ForCausalLM": "Qwen3Config"}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    made = {}
    for name, config in CLASSES.items():
        root = tmp_path_factory.mktemp(name)
        torch.manual_seed(0)
        getattr(transformers, name)(getattr(transformers, config)(**SIZES)).eval().save_pretrained(root / "hf")
        r = run_convert(root / "hf", root / "out", "--quiet")
        assert r.code == 0, r
        made[name] = root / "hf", root / "out"
    return made


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_a_paddleformers_directory_pair_that_would_not_fit_streams_with_the_in_memory_rows(name, pairs, monkeypatch):
    from converter import VerifyOptions, hfpair, verify_directories
    from converter.verify import memory
    hf_dir, out_dir = pairs[name]
    options = VerifyOptions(device="cpu", strategy="full", bisect=True)
    in_memory = verify_directories(str(hf_dir), str(out_dir), options)
    configs = [json.loads((d / "config.json").read_text()) for d in (hf_dir, out_dir)]
    planned = lambda figure: hfpair.directory_memory(str(hf_dir), str(out_dir), *configs, figure)[0]
    low, high = 1, 1 << 40  # the least memory available where the run fits streamed
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if planned(mid).streamed.peak <= mid else (mid, high)
    assert planned(high).in_memory_peak > high
    monkeypatch.setattr(memory, "available_memory", lambda: (high, "the figure this test sets"))
    said = []
    streamed = verify_directories(str(hf_dir), str(out_dir), options, log=said.append)
    assert any(line.startswith("weights: streamed block by block from both directories") for line in said), said
    assert any("streamed from" in n and str(out_dir) in n for n in streamed.forward.notes), streamed.forward.notes
    assert [repr(r) for r in streamed.forward.layers] == [repr(r) for r in in_memory.forward.layers]
    assert repr(streamed.forward.outputs) == repr(in_memory.forward.outputs)
    assert streamed.verdict == in_memory.verdict and streamed.forward.first_bad is None
    assert streamed.forward.weights.checked == in_memory.forward.weights.checked > 20
    assert not streamed.forward.weights.differ
