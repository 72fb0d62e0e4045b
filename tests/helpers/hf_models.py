"""HF-shaped checkpoints and model directories, built with torch alone, for every case that
`scripts/check_mappings_paddlenlp.py --record` recorded (tests/unit/rules/test_families_recorded.json),
and reading back a converted directory. torch is imported by the builders that use it."""

import json
import os

from helpers.cli import ROOT

with open(os.path.join(ROOT, "tests", "unit", "rules", "test_families_recorded.json")) as f:
    RECORDED = json.load(f)


def case_id(case):
    return f"{case['family']}-{case['hf_class']}-{case['how']}" + ("-" + case["note"].split(":")[0].split(" ")[0] if case["note"] else "")


def tied_groups(case):
    """HF keys that hold one tensor in HF (a .bin keeps each of its names)."""
    groups = {}
    for sources, _, _ in case["paddle"].values():
        if len(sources) > 1:
            group = set(sources)
            for k in sources:
                group |= groups.get(k, set())
            for k in group:
                groups[k] = group
    return groups


def hf_state(case, seed=0):
    """Random tensors with the case's HF keys and shapes; tied keys share one tensor, as in HF."""
    import torch
    g = torch.Generator().manual_seed(seed)
    groups = tied_groups(case)
    state = {}
    for key, shape in case["hf"].items():
        twin = next((state[k] for k in sorted(groups.get(key, ())) if k in state), None)
        state[key] = twin if twin is not None else torch.randn(shape, generator=g)
    return state


BERT = next(c for c in RECORDED if c["hf_class"] == "BertModel")
BERT_CONFIG = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 300, "type_vocab_size": 2,
               "layer_norm_eps": 1e-12, "hidden_act": "gelu", "transformers_version": "4.44.2"}


def hf_dir(path, state, config=BERT_CONFIG, shards=1):
    """An HF model directory as save_pretrained writes it: one pytorch_model.bin, or safetensors shards."""
    import torch
    from safetensors.torch import save_file
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if shards == 1:
        torch.save(state, path / "pytorch_model.bin")
        return path
    keys = list(state)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {}
    for i, name in enumerate(names):
        part = keys[i::shards]
        save_file({k: state[k].clone() for k in part}, str(path / name))
        weight_map.update({k: name for k in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def load_dir(out):
    """Every tensor of an output directory, through its index when it has one."""
    from converter.io.pdparams import load_pdparams
    index = out / "model_state.pdparams.index.json"
    if not index.exists():
        return load_pdparams(str(out / "model_state.pdparams"))
    weight_map = json.loads(index.read_text())["weight_map"]
    state = {}
    for shard in sorted(set(weight_map.values())):
        part = load_pdparams(str(out / shard))
        assert sorted(part) == sorted(k for k, v in weight_map.items() if v == shard)
        state.update(part)
    return state
