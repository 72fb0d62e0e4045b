"""verify-port HF_DIR PADDLE_DIR where the run would not fit in memory, on tiny random HF transformers 5
directories (Llama, Qwen3; 3 layers, hidden 256) converted for PaddleFormers 1.2: transformers'
class built from config.json on the meta device (its rotary table computed on the CPU) and
PaddleFormers' under LazyGuard, both streamed block by block from the two directories, give the
in-memory run's rows bit for bit with every loaded weight checked. The memory available is set
between the two estimates (compare/memory.py's available_memory). Runs in the second side
environment (scripts/side_env_paddleformers.sh); elsewhere it is skipped."""

import pytest

from helpers.directories import converted_pair, least_memory_streamed
from hf_paddleformers import transformers

pytest.importorskip("paddleformers")

SIZES = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=1024,
             num_hidden_layers=3, vocab_size=120, max_position_embeddings=64, tie_word_embeddings=False)
CLASSES = {"LlamaForCausalLM": "LlamaConfig", "Qwen3ForCausalLM": "Qwen3Config"}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return {name: converted_pair(tmp_path_factory.mktemp(name), getattr(transformers, name),
                                 getattr(transformers, config)(**SIZES))
            for name, config in CLASSES.items()}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_a_paddleformers_directory_pair_that_would_not_fit_streams_with_the_in_memory_rows(name, pairs, monkeypatch):
    from converter import VerifyOptions, verify_directories
    from converter.compare import memory
    hf_dir, out_dir = pairs[name]
    options = VerifyOptions(device="cpu", strategy="full", bisect=True)
    in_memory = verify_directories(str(hf_dir), str(out_dir), options)
    figure = least_memory_streamed(hf_dir, out_dir)
    monkeypatch.setattr(memory, "available_memory", lambda cap=None: (figure, "the figure this test sets"))
    said = []
    streamed = verify_directories(str(hf_dir), str(out_dir), options, log=said.append)
    assert any(line.startswith("weights: streamed block by block from both directories") for line in said), said
    assert any("streamed from" in n and str(out_dir) in n for n in streamed.forward.notes), streamed.forward.notes
    assert [repr(r) for r in streamed.forward.layers] == [repr(r) for r in in_memory.forward.layers]
    assert repr(streamed.forward.outputs) == repr(in_memory.forward.outputs)
    assert streamed.verdict == in_memory.verdict and streamed.forward.first_bad is None
    assert streamed.forward.weights.checked == in_memory.forward.weights.checked > 20
    assert not streamed.forward.weights.differ
