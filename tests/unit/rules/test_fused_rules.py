"""Merges by groups (PaddleFormers' interleaved q|k|v), their inverse split, and stacking per-item
tensors into one tensor and back: checked when the file is read, planned exactly, bit-exact."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers.cli import run_convert
from converter.compare.fused import merged_modules
from converter.errors import UserError
from converter.io.base import TensorInfo
from converter.rules.plan import build_plan
from converter.rules.ruleset import parse_ruleset

QKV = ["(.*)\\.q_proj\\.(weight|bias)", "(.*)\\.k_proj\\.(weight|bias)", "(.*)\\.v_proj\\.(weight|bias)"]


def _infos(arrays):
    return {k: TensorInfo(k, str(v.dtype), tuple(v.shape)) for k, v in arrays.items()}


def _convert(arrays, rules, params=None):
    """What the plan writes for `arrays` under `rules`: name -> array."""
    ruleset = parse_ruleset({"name": "t", "rules": rules}, "t.json")
    if params is not None:
        ruleset = ruleset.with_params(params)
    plan = build_plan(_infos(arrays), ruleset)
    return plan, {e.name: e.compute(lambda k: arrays[k]) for e in plan.entries}


def _interleaved(q, k, v, kv_heads):
    """PaddleFormers' fused q|k|v on the output axis (the first of torch's [out, in]), built by
    reshaping to heads: for each KV head g, the query heads of group g, then k_g, then v_g."""
    rest = q.shape[1:]
    q = q.reshape((kv_heads, -1) + rest)
    k = k.reshape((kv_heads, -1) + rest)
    v = v.reshape((kv_heads, -1) + rest)
    return np.concatenate([q, k, v], axis=1).reshape((-1,) + rest)


def _qkv(rng, heads, kv_heads, head_dim, hidden, dtype="float32"):
    return {f"l.{n}_proj.weight": rng.standard_normal((h * head_dim, hidden)).astype(dtype)
            for n, h in (("q", heads), ("k", kv_heads), ("v", kv_heads))}


@settings(max_examples=40, deadline=None)
@given(kv_heads=st.integers(1, 5), group=st.integers(1, 4), head_dim=st.integers(1, 6), hidden=st.integers(1, 7),
       transpose=st.booleans(), seed=st.integers(0, 2**16))
def test_merge_by_groups_is_the_interleaved_layout_and_split_undoes_it(kv_heads, group, head_dim, hidden,
                                                                     transpose, seed):
    rng = np.random.default_rng(seed)
    heads = kv_heads * group
    arrays = _qkv(rng, heads, kv_heads, head_dim, hidden)
    rules = [{"kind": "merge", "match": QKV, "to": "\\1.qkv_proj.\\2", "axis": 1 if transpose else 0,
              "groups": kv_heads}]
    if transpose:
        rules.append({"kind": "transpose", "match": ".*\\.weight"})
    _, out = _convert(arrays, rules)
    expected = _interleaved(*(arrays[f"l.{n}_proj.weight"] for n in "qkv"), kv_heads)
    fused = out["l.qkv_proj.weight"]
    assert np.array_equal(fused, expected.T if transpose else expected)

    back_rules = [{"kind": "split", "match": "(.*)\\.qkv_proj\\.weight", "axis": 1 if transpose else 0,
                   "to": ["\\1.q_proj.weight", "\\1.k_proj.weight", "\\1.v_proj.weight"], "groups": kv_heads,
                   "sizes": [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]}]
    if transpose:
        back_rules.append({"kind": "transpose", "match": ".*\\.weight"})
    _, back = _convert({"l.qkv_proj.weight": fused}, back_rules)
    assert sorted(back) == sorted(arrays)
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype and np.array_equal(back[name], array), name


def test_one_group_is_the_plain_concatenation():
    rng = np.random.default_rng(0)
    arrays = _qkv(rng, 4, 1, 3, 5)
    rules = [{"kind": "merge", "match": QKV, "to": "\\1.qkv_proj.\\2", "axis": 0}]
    plain = _convert(arrays, rules)[1]["l.qkv_proj.weight"]
    grouped = _convert(arrays, [dict(rules[0], groups=1)])[1]["l.qkv_proj.weight"]
    assert np.array_equal(plain, grouped)
    assert np.array_equal(plain, np.concatenate([arrays[f"l.{n}_proj.weight"] for n in "qkv"]))
    with_two = _convert(_qkv(rng, 4, 2, 3, 5), [dict(rules[0], groups=2)])[1]["l.qkv_proj.weight"]
    assert with_two.shape == (24, 5)


def test_groups_from_the_config_and_the_plan_knows_each_block():
    """`groups` may name a config field; the plan lists each part's blocks in output order, and the
    verifier pairs the fused layer with its modules whether they are interleaved or concatenated
    (compare/fused.py gathers each module's blocks)."""
    rng = np.random.default_rng(1)
    arrays = _qkv(rng, 4, 2, 3, 5)
    arrays.update({f"l.{n}_proj.bias": rng.standard_normal(s).astype("float32")
                   for n, s in (("q", 12), ("k", 6), ("v", 6))})
    rules = [{"kind": "merge", "match": QKV, "to": "\\1.qkv_proj.\\2", "axis": -1, "groups": "num_key_value_heads"},
             {"kind": "transpose", "match": ".*\\.weight"}]
    with pytest.raises(UserError) as info:
        _convert(arrays, rules)
    assert "'groups' names the config field 'num_key_value_heads', which is not known here" in info.value.details[0]
    with pytest.raises(UserError) as info:
        _convert(arrays, rules, {"num_key_value_heads": 0})
    assert "holds 0, not a positive integer" in info.value.details[0]
    plan, out = _convert(arrays, rules, {"num_key_value_heads": 2})
    entry = plan.by_output_name()["l.qkv_proj.weight"]
    assert [(p.source, p.piece) for p in entry.parts] == [
        ("l.q_proj.weight", (0, 0, 6)), ("l.k_proj.weight", (0, 0, 3)), ("l.v_proj.weight", (0, 0, 3)),
        ("l.q_proj.weight", (0, 6, 12)), ("l.k_proj.weight", (0, 3, 6)), ("l.v_proj.weight", (0, 3, 6))]
    assert entry.merge_axis == 1 and entry.shape == (5, 24)
    bias = out["l.qkv_proj.bias"]
    assert np.array_equal(bias, _interleaved(*(arrays[f"l.{n}_proj.bias"] for n in "qkv"), 2))
    assert merged_modules(plan) == {"l.qkv_proj": ("l.q_proj", "l.k_proj", "l.v_proj")}
    concatenated, _ = _convert(arrays, [dict(rules[0], groups=1), rules[1]])
    assert merged_modules(concatenated) == {"l.qkv_proj": ("l.q_proj", "l.k_proj", "l.v_proj")}


@settings(max_examples=40, deadline=None)
@given(items=st.integers(1, 5), rows=st.integers(1, 4), cols=st.integers(1, 4), parts=st.integers(1, 3),
       transpose=st.booleans(), seed=st.integers(0, 2**16))
def test_stack_and_unstack_are_inverse(items, rows, cols, parts, transpose, seed):
    """Per-item tensors stacked on a new first axis (each transposed first, where a transpose
    rule says so), and the stacked tensor taken apart into per-item parts split on its first axis."""
    rng = np.random.default_rng(seed)
    arrays = {f"m.experts.{e}.w": rng.standard_normal((rows * parts, cols)).astype("float64") for e in range(items)}
    rules = [{"kind": "stack", "match": "(.*)\\.experts\\.(?P<e>\\d+)\\.w", "to": "\\1.experts.w", "index": "e",
              "count": items}]
    if transpose:
        rules.append({"kind": "transpose", "match": ".*\\.experts\\.\\d+\\.w"})
    _, out = _convert(arrays, rules)
    stacked = out["m.experts.w"]
    expected = np.stack([arrays[f"m.experts.{e}.w"] for e in range(items)])
    assert np.array_equal(stacked, expected.transpose(0, 2, 1) if transpose else expected)

    if transpose:  # back through the transpose, each item whole
        back_rules = [{"kind": "unstack", "match": "(.*)\\.experts\\.w", "to": "\\1.experts.\\g<n>.w", "index": "n"},
                      {"kind": "transpose", "match": ".*\\.experts\\.w"}]
        _, back = _convert({"m.experts.w": stacked}, back_rules)
        assert sorted(back) == sorted(arrays)
        assert all(np.array_equal(back[k], arrays[k]) for k in arrays)
        return
    names = [f"\\1.experts.\\g<n>.p{j}" for j in range(parts)]
    back_rules = [{"kind": "unstack", "match": "(.*)\\.experts\\.w", "to": names if parts > 1 else names[0],
                   "index": "n", "count": items}]
    _, back = _convert({"m.experts.w": stacked}, back_rules)
    assert len(back) == items * parts
    for e in range(items):
        for j in range(parts):
            assert np.array_equal(back[f"m.experts.{e}.p{j}"], arrays[f"m.experts.{e}.w"][j * rows:(j + 1) * rows])


def test_unstack_transposes_each_item_and_takes_sizes():
    """HF 5's live [E, 2I, H] gate_up_proj into per-expert [H, I] gate and up weights."""
    rng = np.random.default_rng(2)
    gate_up = rng.standard_normal((3, 8, 5)).astype("float32")
    rules = [{"kind": "unstack", "match": "(.*)\\.gate_up_proj", "index": "e", "sizes": [4, 4],
              "to": ["\\1.\\g<e>.gate_proj.weight", "\\1.\\g<e>.up_proj.weight"]},
             {"kind": "transpose", "match": ".*\\.gate_up_proj"}]
    plan, out = _convert({"mlp.experts.gate_up_proj": gate_up}, rules)
    assert [e.name for e in plan.entries] == [f"mlp.experts.{e}.{n}_proj.weight" for e in range(3) for n in ("gate", "up")]
    for e in range(3):
        assert np.array_equal(out[f"mlp.experts.{e}.gate_proj.weight"], gate_up[e, :4].T)
        assert np.array_equal(out[f"mlp.experts.{e}.up_proj.weight"], gate_up[e, 4:].T)


def _problems(arrays, rules, params=None):
    with pytest.raises(UserError) as info:
        _convert(arrays, rules, params)
    return info.value.details


def test_plan_problems_are_named():
    a = np.zeros((6, 2), "float32")
    merge = {"kind": "merge", "match": QKV, "to": "\\1.qkv_proj.\\2", "axis": 0, "groups": 4}
    assert _problems({"l.q_proj.weight": a, "l.k_proj.weight": a, "l.v_proj.weight": a}, [merge]) == [
        "target 'l.qkv_proj.weight': parts of sizes [6, 6, 6] on axis 0 do not each divide into 4 groups (t.json rule 1)"]
    split = {"kind": "split", "key": "w", "to": ["a", "b"], "axis": 0, "sizes": [4, 2], "groups": 4}
    assert "do not each divide into 4 groups" in _problems({"w": a}, [split])[0]
    stack = {"kind": "stack", "match": "e\\.(\\d+)\\.w", "to": "w", "index": 1}
    assert _problems({"e.0.w": a, "e.2.w": a}, [stack]) == ["target 'w' is missing item(s) 1 (t.json rule 1)"]
    assert _problems({"e.0.w": a, "e.999999999.w": a}, [stack]) == [
        "target 'w' is missing item(s) 1, 2, 3, 4, 5, ... (t.json rule 1)"]
    assert _problems({"e.0.w": a, "e.1.w": a}, [dict(stack, count=1)]) == [
        "target 'w' has item(s) [1] past the 1 its rule says (t.json rule 1)"]
    assert "items differ in shape" in _problems({"e.0.w": a, "e.1.w": a[:3]}, [stack])[0]
    assert "is not a decimal number" in _problems({"e.x.w": a}, [dict(stack, match="e\\.(.+)\\.w")])[0]
    unstack = {"kind": "unstack", "match": "w", "to": "\\g<n>.w", "index": "n", "count": 3}
    assert "holds 6 items, not the 3 its rule says" in _problems({"w": a}, [unstack])[0]
    assert "is not a stack of tensors" in _problems({"w": np.zeros(4, "float32")}, [dict(unstack, count=4)])[0]
    assert "do not add up to an item's first axis, 2" in _problems({"w": a}, [dict(unstack, to=["\\g<n>.a", "\\g<n>.b"],
                                                                                   sizes=[1, 2], count=6)])[0]


@pytest.mark.parametrize("rule, says", [
    ({"kind": "merge", "match": QKV, "to": "x", "axis": 0, "groups": 0}, "'groups' must be a positive integer or"),
    ({"kind": "merge", "match": QKV, "to": "x", "axis": 0, "groups": "a b"}, "'groups' must be a positive integer or"),
    ({"kind": "merge", "match": QKV, "to": "x", "axis": 0, "groups": True}, "'groups' must be a positive integer or"),
    ({"kind": "split", "key": "w", "to": ["a", "b"], "axis": 0, "groups": 2.0}, "'groups' must be a positive"),
    ({"kind": "rename", "key": "w", "to": "a", "groups": 2}, "rename rule has unknown field(s) 'groups'"),
    ({"kind": "stack", "match": "e\\.(\\d+)\\.w", "to": "w"}, "stack rule needs field(s) index"),
    ({"kind": "stack", "key": "e.0.w", "to": "w", "index": 1}, "stack takes 'match' (a regular expression), not 'key'"),
    ({"kind": "stack", "match": "e\\.(\\d+)\\.w", "to": "w", "index": 2}, "'index' '2' is not a group of the pattern"),
    ({"kind": "stack", "match": "e\\.(?P<e>\\d+)\\.w", "to": "w", "index": "x"}, "'index' 'x' is not a group"),
    ({"kind": "stack", "match": "e\\.(\\d+)\\.w", "to": "w\\1", "index": 1}, "'to' must not use the index group"),
    ({"kind": "stack", "match": "e\\.(\\d+)\\.w", "to": ["w"], "index": 1}, "stack needs 'to' as one target name"),
    ({"kind": "stack", "match": "e\\.(\\d+)\\.w", "to": "w", "index": 1, "count": -1}, "'count' must be a positive"),
    ({"kind": "unstack", "match": "w", "to": "w.x", "index": "n"}, "must use \\g<n>, the item's number"),
    ({"kind": "unstack", "match": "(?P<n>w)", "to": "\\g<n>.x", "index": "n"}, "'index' must be a name that the"),
    ({"kind": "unstack", "match": "w", "to": "\\g<m>.x", "index": "n"}, "refers to group 'm'"),
    ({"kind": "unstack", "match": "w", "to": [], "index": "n"}, "'to' must be a list of at least 1 string"),
    ({"kind": "unstack", "match": "w", "to": ["\\g<n>.a", "\\g<n>.b"], "index": "n", "sizes": [1]},
     "unstack 'sizes' needs one size per target"),
    ({"kind": "unstack", "match": "w", "to": "\\g<n>.x", "index": 3}, "'index' must be a name that the pattern"),
])
def test_bad_rules_are_one_line_when_the_file_is_read(tmp, rule, says):
    with pytest.raises(UserError) as info:
        parse_ruleset({"rules": [rule]}, "r.json")
    assert info.value.message.startswith("r.json rule 1: ") and says in info.value.message
    assert "\n" not in info.value.message
    (tmp / "r.json").write_text(json.dumps({"rules": [rule]}))
    import torch
    torch.save({"w": torch.zeros(2)}, tmp / "m.bin")
    r = run_convert(tmp / "m.bin", tmp / "o.pdparams", "--mapping", tmp / "r.json")
    assert r.code == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert says in r.stderr and not (tmp / "o.pdparams").exists()


def test_convert_weights_writes_and_reads_back_fused_and_stacked_tensors(tmp):
    """The whole command: the writer, and its bit-for-bit read-back, through every new kind."""
    from safetensors.numpy import load_file, save_file
    rng = np.random.default_rng(3)
    src = {}
    for layer in range(2):
        p = f"model.layers.{layer}."
        src.update({p + k: v for k, v in _qkv(rng, 4, 2, 4, 16).items()})
        src.update({p + f"mlp.experts.{e}.down_proj.weight": rng.standard_normal((16, 6)).astype("float32")
                    for e in range(3)})
        src[p + "mlp.experts.gate_up_proj"] = rng.standard_normal((3, 12, 16)).astype("float32")
    src = {k.replace(".l.", ".self_attn."): v for k, v in src.items()}
    save_file(src, str(tmp / "m.safetensors"))
    rules = [{"kind": "merge", "match": QKV, "to": "\\1.qkv_proj.\\2", "axis": 1, "groups": 2},
             {"kind": "transpose", "match": ".*_proj\\.weight|.*\\.gate_up_proj"},
             {"kind": "stack", "match": "(.*)\\.experts\\.(?P<e>\\d+)\\.down_proj\\.weight", "to": "\\1.experts.down",
              "index": "e", "count": 3},
             {"kind": "unstack", "match": "(.*)\\.experts\\.gate_up_proj", "index": "n",
              "to": ["\\1.experts.\\g<n>.gate_proj.weight", "\\1.experts.\\g<n>.up_proj.weight"]}]
    (tmp / "r.json").write_text(json.dumps({"name": "fused", "rules": rules}))
    r = run_convert(tmp / "m.safetensors", tmp / "o.safetensors", "--mapping", tmp / "r.json")
    assert r.code == 0, r
    assert "check passed: every written tensor matches its source bit for bit" in r.stderr
    out = load_file(str(tmp / "o.safetensors"))
    assert len(out) == 2 * (1 + 1 + 6)
    p = "model.layers.1."
    q, k, v = (src[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
    assert np.array_equal(out[p + "self_attn.qkv_proj.weight"], _interleaved(q, k, v, 2).T)
    assert np.array_equal(out[p + "mlp.experts.down"],
                          np.stack([src[p + f"mlp.experts.{e}.down_proj.weight"].T for e in range(3)]))
    assert np.array_equal(out[p + "mlp.experts.2.up_proj.weight"], src[p + "mlp.experts.gate_up_proj"][2, 6:].T)


def test_a_model_directory_gives_the_groups_from_its_config(tmp):
    """convert-weights HF_DIR OUT_DIR reads a merge's `groups` from config.json; the same rules on
    the directory's weights file alone name the field they lack."""
    import torch
    from helpers.hf_models import hf_dir, load_dir
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "vocab_size": 10, "max_position_embeddings": 32, "initializer_range": 0.02}
    torch.manual_seed(0)
    state = {f"model.layers.0.self_attn.{n}_proj.weight": torch.randn(s, 8) for n, s in (("q", 8), ("k", 4), ("v", 4))}
    src = hf_dir(tmp / "hf", state, config=config)
    rules = {"name": "grouped", "unmatched": "keep", "rules": [
        {"kind": "merge", "match": QKV, "to": "\\1.qkv_proj.\\2", "axis": 1, "groups": "num_key_value_heads"},
        {"kind": "transpose", "match": ".*\\.weight"}]}
    (tmp / "rules.json").write_text(json.dumps(rules))
    r = run_convert(src, tmp / "out", "--quiet", "--mapping", tmp / "rules.json")
    assert r.code == 0, r
    got = load_dir(tmp / "out")
    q, k, v = (state[f"model.layers.0.self_attn.{n}_proj.weight"].numpy() for n in "qkv")
    assert list(got) == ["model.layers.0.self_attn.qkv_proj.weight"]
    assert np.array_equal(got["model.layers.0.self_attn.qkv_proj.weight"], _interleaved(q, k, v, 2).T)
    alone = run_convert(tmp / "hf" / "pytorch_model.bin", tmp / "o.pdparams", "--mapping", tmp / "rules.json")
    assert alone.code == 2 and "names the config field 'num_key_value_heads', which is not known here" in alone.stderr
    assert not (tmp / "o.pdparams").exists()
