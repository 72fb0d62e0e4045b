"""verify-port HF_DIR PADDLE_DIR where the run would not fit in memory: tiny random HF transformers 4
directories (a BertForSequenceClassification, a LlamaForCausalLM; safetensors, as save_pretrained
writes them) converted for PaddleNLP 2.8.1 are verified with both models built without their
weights (torch's from config.json on the meta device, its buffers computed; paddle's under
LazyGuard) and streamed block by block from the two directories. The rows are the in-memory
run's bit for bit, every loaded weight is checked, the log and the report say why it streams,
and a weight changed in PADDLE_DIR's file is named. The memory available is set between the two
estimates (compare/memory.py's available_memory). Runs only where transformers and PaddleNLP are
installed (scripts/side_env.sh); elsewhere it is skipped."""

import numpy as np
import pytest

from helpers.directories import converted_pair, directory_with_weights, least_memory_streamed

transformers = pytest.importorskip("transformers")
pytest.importorskip("paddlenlp")

SIZES = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=3, vocab_size=120, max_position_embeddings=64)
CASES = {
    "BertForSequenceClassification": (lambda: transformers.BertConfig(num_attention_heads=4, num_labels=3, **SIZES), []),
    "LlamaForCausalLM": (lambda: transformers.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **SIZES),
                         ["--target", "paddlenlp"]),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    made = {}
    for name, (config, target) in CASES.items():
        hf_dir, out_dir = converted_pair(tmp_path_factory.mktemp(name), getattr(transformers, name), config(), *target)
        assert (hf_dir / "model.safetensors").is_file()
        made[name] = hf_dir, out_dir
    return made


def _streamed(monkeypatch, hf_dir, paddle_dir):
    from converter import VerifyOptions, verify_directories
    from converter.compare import memory
    figure = least_memory_streamed(hf_dir, paddle_dir)
    monkeypatch.setattr(memory, "available_memory", lambda cap=None: (figure, "the figure this test sets"))
    said = []
    report = verify_directories(str(hf_dir), str(paddle_dir), VerifyOptions(device="cpu", strategy="full", bisect=True),
                                log=said.append)
    return report, said


def _in_memory(hf_dir, paddle_dir):
    from converter import VerifyOptions, verify_directories
    return verify_directories(str(hf_dir), str(paddle_dir), VerifyOptions(device="cpu", strategy="full", bisect=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_directory_pair_that_would_not_fit_streams_with_the_in_memory_rows(name, pairs, monkeypatch):
    hf_dir, out_dir = pairs[name]
    in_memory = _in_memory(hf_dir, out_dir)
    streamed, said = _streamed(monkeypatch, hf_dir, out_dir)
    assert [repr(r) for r in streamed.forward.layers] == [repr(r) for r in in_memory.forward.layers]
    assert repr(streamed.forward.outputs) == repr(in_memory.forward.outputs)
    assert streamed.verdict == in_memory.verdict and streamed.forward.first_bad is None
    assert streamed.forward.weights.checked == in_memory.forward.weights.checked > 20
    assert not streamed.forward.weights.differ
    why = [line for line in said if line.startswith("weights: streamed block by block from both directories")]
    assert len(why) == 1 and "the figure this test sets" in why[0], said
    notes = streamed.forward.notes
    assert any("streamed from" in n and str(out_dir) in n for n in notes), notes
    assert any(n.startswith("weights: streamed block by block, as in memory the run needs about") for n in notes), notes
    assert not any("streamed" in n for n in in_memory.forward.notes)


def test_a_weight_changed_in_a_streamed_paddle_directory_is_named(pairs, monkeypatch, tmp_path):
    from converter.io.pdparams import load_pdparams
    hf_dir, out_dir = pairs["LlamaForCausalLM"]
    weights = {k: np.array(v) for k, v in load_pdparams(str(out_dir / "model_state.pdparams")).items()}
    key = next(k for k in weights if k.endswith("layers.1.mlp.up_proj.weight"))
    weights[key][3, 11] += 0.25
    planted = directory_with_weights(out_dir, tmp_path / "planted", weights)
    in_memory = _in_memory(hf_dir, planted)
    streamed, _ = _streamed(monkeypatch, hf_dir, planted)
    (differ,) = streamed.forward.weights.differ
    assert differ.paddle == key and differ.index == (3, 11) and differ.differ == 1
    assert [d.to_json() for d in streamed.forward.weights.differ] == [d.to_json() for d in in_memory.forward.weights.differ]
    assert streamed.exit_code == in_memory.exit_code == 1
    assert [repr(r) for r in streamed.forward.layers] == [repr(r) for r in in_memory.forward.layers]


def test_a_directory_pair_given_less_memory_than_it_needs_in_memory_streams_within_it(pairs, monkeypatch):
    """VerifyOptions.max_memory (--max-memory): what it leaves beside what the process holds is the
    memory available, on a machine with room to spare; a pair that would not fit in it streams.
    What the process holds is set to a figure: a tiny pair's window between the two estimates is
    a few MB, less than what a set-up's allocations move the resident set by."""
    import json

    from converter import VerifyOptions, verify_directories
    from converter.hf import pair
    from converter.compare import memory
    hf_dir, out_dir = pairs["LlamaForCausalLM"]
    configs = [json.loads((d / "config.json").read_text()) for d in (hf_dir, out_dir)]
    planned = lambda figure: pair.directory_memory(str(hf_dir), str(out_dir), *configs, figure)[0]
    low = least_memory_streamed(hf_dir, out_dir)
    room = low + (planned(low).in_memory_peak - low) // 2
    assert planned(room).in_memory_peak > room >= planned(room).streamed.peak
    in_memory = _in_memory(hf_dir, out_dir)
    monkeypatch.setattr(memory, "resident_bytes", lambda: 1 << 30)
    said = []
    options = VerifyOptions(device="cpu", strategy="full", bisect=True, max_memory=(1 << 30) + room)
    streamed = verify_directories(str(hf_dir), str(out_dir), options, log=said.append)
    assert [repr(r) for r in streamed.forward.layers] == [repr(r) for r in in_memory.forward.layers]
    assert streamed.verdict == in_memory.verdict == "pass"
    why = [line for line in said if line.startswith("weights: streamed block by block from both directories")]
    assert len(why) == 1 and "by --max-memory" in why[0] and "this process holds" in why[0], said
