"""`convert-weights HF_DIR OUT_DIR`: an HF model directory (config.json and single or sharded
weights) to what PaddleFormers' or PaddleNLP's from_pretrained(OUT_DIR) loads: model_state.pdparams
(or shards model_state-0000i-of-0000n.pdparams with model_state.pdparams.index.json) and a
config.json in that library's field names (PaddleFormers 1.2 reads HF 5's own). The library is
`target`'s; by default PaddleFormers where it has config.json's model_type, else PaddleNLP.

The directory appears complete or not at all: everything is written into a hidden directory
beside OUT_DIR, each file checked as convert-weights checks one, and given OUT_DIR's name last
(io/atomic.py's StagedDirectory); --force replaces only a directory this tool wrote.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from fractions import Fraction

from .. import dtypes
from ..errors import MAX_SIZE, UserError, quoted, shown_value
from .config import Translated, shown, translate_config
from ..io import open_source
from ..io.atomic import OutputGroup, check_outputs
from ..io.base import Source
from ..io.inputs import CONFIG_CAP, read_small_file
from ..rules.detect import LIBRARIES, check_target
from ..rules.plan import MappingPlan, build_plan
from ..rules.ruleset import resolve_mapping

WEIGHTS = "model_state.pdparams"
# the key of OUT_DIR's config.json that names the library it was written for (paddleformers or
# paddlenlp): verify-port HF_DIR OUT_DIR builds that library's class
WRITTEN_FOR = "paddle_library"
INDEX = "model_state.pdparams.index.json"
CONFIG = "config.json"
# PaddleFormers' default from_pretrained writes this into any directory it is given (and then fails
# on ours, which holds paddle weights, not HF's safetensors): --force may replace a directory holding it.
PADDLEFORMERS_METADATA = "flex-ckpt.auto_generated.metadata"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def is_model_directory(path: str) -> bool:
    """A directory with a config.json of any kind (one that is not a readable file is refused
    when it is read, rather than taking the directory for something else)."""
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, CONFIG))


def converts_a_directory(src: str, dst: str) -> bool:
    """An HF model directory (config.json beside the weights) into a directory, not a weights file."""
    from ..io.open import OUTPUT_FORMATS
    return is_model_directory(src) and not dst.lower().endswith(tuple(OUTPUT_FORMATS))


def parse_size(text: str) -> int:
    """'5GB' (10^9), '500MiB' (2^20) or a number of bytes, as HF's max_shard_size: exact (no float),
    from 1 byte to MAX_SIZE; one line otherwise, however many digits it has."""
    m = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([KMGT]i?B|B)?\s*", str(text), re.IGNORECASE)
    size = int(Fraction(m.group(1)) * _UNITS[(m.group(2) or "").upper()]) if m else 0
    if not 1 <= size <= MAX_SIZE:
        raise UserError(f"--max-shard-size {shown_value(text)} is not a size from 1 byte to 4 EiB; give one like 5GB, "
                        "500MB or 2GiB")
    return size


def read_config(directory: str) -> dict:
    """config.json as a dict of JSON values, nested at most CONFIG_DEPTH deep and with no integer
    longer than Python reads; one line naming what is wrong otherwise."""
    path = os.path.join(directory, CONFIG)
    where = quoted(path)
    try:
        body = json.loads(read_small_file(path, "config file", CONFIG_CAP).decode("utf-8"), parse_int=_parse_int)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{where} is not valid JSON ({exc}); re-download it") from None
    except RecursionError:
        raise UserError(f"{where} nests objects or lists hundreds of levels deep, where no config goes past a few "
                        f"(at most {CONFIG_DEPTH} are taken); re-download it") from None
    if not isinstance(body, dict):
        raise UserError(f"{where} is not a JSON object; re-download it")
    for name, value in body.items():
        _check_nesting(where, name, value)
    return body


CONFIG_DEPTH = 64


class _LongInteger:
    """An integer in config.json longer than Python converts from text (sys.get_int_max_str_digits)."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))


def _parse_int(text: str):
    try:
        return int(text)
    except ValueError:
        return _LongInteger(text)


def _check_nesting(where: str, name: str, value) -> None:
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, _LongInteger):
            raise UserError(f"{where}: field {shown(name)} holds an integer of {value.digits} digits, more than any "
                            "config field takes; correct it in config.json (or re-download it)")
        if isinstance(value, (dict, list)):
            if depth > CONFIG_DEPTH:
                raise UserError(f"{where}: field {shown(name)} nests objects or lists more than {CONFIG_DEPTH} levels "
                                "deep, more than any config field; correct it in config.json (or re-download it)")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


class _View(Source):
    """A view of a source with some keys left out (a tied head the config says is a copy), and some
    read from another key (a tied head written as a copy of the word embeddings)."""

    def __init__(self, inner: Source, left_out: set[str] = frozenset(), copies: dict[str, str] | None = None):
        super().__init__(inner.path)
        self.inner, self.files, self.notes = inner, inner.files, list(inner.notes)
        self.copies = copies or {}
        self.infos = {k: v for k, v in inner.infos.items() if k not in left_out and k not in self.copies}
        self.infos |= {k: dataclasses.replace(inner.infos[of], name=k) for k, of in self.copies.items()}

    def read(self, name):
        return self.inner.read(self.copies.get(name, name))

    def reference(self, name):
        return self.inner.reference(self.copies.get(name, name))

    def release(self, name):
        self.inner.release(self.copies.get(name, name))


def shards(plan: MappingPlan, limit: int | None) -> list[MappingPlan]:
    """The plan cut, in order, into plans of at most `limit` bytes (a larger tensor alone)."""
    groups, size = [[]], 0
    for entry in plan.entries:
        nbytes = entry.info.nbytes * (1 + len(entry.aliases))
        if limit is not None and groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += nbytes
    return [MappingPlan(g, plan.dropped if i == 0 else [], plan.ruleset) for i, g in enumerate(groups)]


def _write_json(output, body: dict) -> None:
    output.file.write((json.dumps(body, indent=2, sort_keys=False) + "\n").encode("utf-8"))


_WRITTEN = re.compile(r"model_state-\d{5}-of-\d{5}\.pdparams")


def not_written_here(directory: str) -> str | None:
    """Why --force may not replace `directory` (None: it holds only the files convert-weights
    writes into OUT_DIR, or nothing)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        return f"output {quoted(directory)} cannot be listed ({exc.strerror}); give a new path"
    for name in names:
        full = os.path.join(directory, name)
        ours = name in (WEIGHTS, INDEX, CONFIG, PADDLEFORMERS_METADATA) or _WRITTEN.fullmatch(name)
        if not ours or os.path.islink(full) or not os.path.isfile(full):
            return (f"output {quoted(directory)} holds {quoted(name)}, which convert-weights does not write; "
                    "--force replaces only a directory this tool wrote: give a new path")
    return None


def convert_directory(src: str, dst: str, mapping: str | None = None, dtype: str | None = None, force: bool = False,
                      max_shard_size: str | None = None, progress: bool = True, log=lambda line: None,
                      json_path: str | None = None, target: str | None = None) -> dict:
    """Convert an HF model directory; returns a summary (files written, tensors, bytes, mapping),
    also written as JSON to `json_path`, together with OUT_DIR (both or neither)."""
    from ..convert import write_plan
    inputs = [src, os.path.join(src, CONFIG), mapping]  # a hard link elsewhere to config.json is config.json
    check_outputs({"--json": json_path}, inputs, force, directories={"OUT_DIR": dst})
    dst = os.path.abspath(dst)
    if force and os.path.isdir(dst):
        refused = not_written_here(dst)
        if refused:
            raise UserError(refused)
    hf_config = read_config(src)
    translated = translate_config(hf_config, force, where=quoted(os.path.join(src, CONFIG)),
                                  target=check_target(target))
    for note in translated.notes:
        log(f"note: config.json: {note}")
    limit = parse_size(max_shard_size) if max_shard_size else None
    with open_source(src) as opened:
        check_outputs({"--json": json_path}, inputs + opened.files, force, directories={"OUT_DIR": dst})
        source = _tied_head(opened, translated, log)
        if mapping and mapping != "auto":
            ruleset = resolve_mapping(mapping)
        else:
            check_untied_head(source, translated)
            ruleset = resolve_mapping(translated.family.mapping)
            log(f"mapping: '{ruleset.name}' for {LIBRARIES[translated.family.target]} (config.json's model_type is "
                f"'{translated.family.model_type}')")
        ruleset = ruleset.with_params(hf_config)  # the head counts a merge by groups may name
        plan = build_plan(source.infos, ruleset, dtype=dtypes.canonical(dtype) if dtype else None)
        if limit is None:  # a sharded source's largest shard, so that the output has about as many
            data = [f for f in opened.files if not f.endswith(".json")]
            limit = max(os.path.getsize(f) for f in data) if len(data) > 1 else None
        pieces = shards(plan, limit)
        names = [WEIGHTS] if len(pieces) == 1 else [f"model_state-{i + 1:05d}-of-{len(pieces):05d}.pdparams"
                                                    for i in range(len(pieces))]
        with OutputGroup(force) as outputs:
            report = outputs.file(json_path) if json_path else None  # opened first: a read-only disk fails now
            staged = outputs.directory(dst, not_written_here).staging
            for piece, name in zip(pieces, names):
                with OutputGroup() as inside:  # the hidden directory is new: nothing in it to replace
                    write_plan(source, piece, inside.file(os.path.join(staged, name)), "pdparams", progress)
            with OutputGroup() as inside:
                if len(pieces) > 1:
                    _write_json(inside.file(os.path.join(staged, INDEX)), {
                        "metadata": {"total_size": plan.total_bytes},
                        "weight_map": {i.name: n for piece, n in zip(pieces, names) for i in piece.output_infos()}})
                _write_json(inside.file(os.path.join(staged, CONFIG)),
                            {**translated.config, WRITTEN_FOR: translated.family.target})
            done = {"output": dst, "files": names + ([INDEX] if len(pieces) > 1 else []) + [CONFIG],
                    "mapping": ruleset.name, "tensors": len(plan.output_infos()), "bytes": plan.total_bytes,
                    "dropped": plan.dropped}
            if report is not None:
                from ..cli_common import json_text
                report.file.write(json_text(done).encode("utf-8"))
    return done


def _tied_head(source: Source, translated: Translated, log) -> Source:
    """A tied config's head is the word embeddings. Where the target's class ties it itself, a copy
    in the weights (if any) is left out, as HF's model ignores it; where it does not, the head is
    written as a copy of the embeddings."""
    family = translated.family
    head, embeddings = family.tied_head, family.head_copy_of
    if not head or not _tied(translated):
        return source
    if embeddings and embeddings in source.infos:
        log(f"note: wrote '{head}' as a copy of '{embeddings}': config.json ties them, and "
            f"{LIBRARIES[family.target]}'s {family.model_type} class does not tie them itself")
        return _View(source, copies={head: embeddings})
    if head in source.infos and not embeddings:
        log(f"note: left out '{head}': config.json ties it to the word embeddings, which the model uses instead")
        return _View(source, left_out={head})
    return source


def _tied(translated: Translated) -> bool:
    return translated.config.get("tie_word_embeddings", translated.family.ties)


def check_untied_head(source: Source, translated: Translated) -> None:
    """An untied causal LM whose weights hold no head would start it from random values in the
    target library: refused (checked when the family's own rule set converts it)."""
    family, config = translated.family, translated.config
    causal_lm = any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])
    if family.tied_head and causal_lm and not _tied(translated) and family.tied_head not in source.infos:
        raise UserError(f"config.json unties the LM head (tie_word_embeddings: false) but the weights hold no "
                        f"'{family.tied_head}': {LIBRARIES[family.target]} would start it from random values; set "
                        "tie_word_embeddings to true in config.json if the head is the word embeddings, or add the "
                        "head's weights")
