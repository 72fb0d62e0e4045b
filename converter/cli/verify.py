"""The verify-port command: parse options, run the API's verify_port, render its PortReport, exit
by its verdict."""

from __future__ import annotations

import math
import os
import re
import sys

import click

from .. import api, progress
from ..cli_common import check_outputs, write_outputs
from ..errors import UserError
from ..report import render_html, render_json, render_text
from .common import CONTEXT, OneLineCommand, one_line_errors, progress_shown, say

BUNDLED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "bert_port.py")


@click.command(cls=OneLineCommand, context_settings=CONTEXT)
@click.argument("directories", nargs=-1, metavar="[HF_DIR PADDLE_DIR]")
@click.option("--spec", "spec_path", metavar="FILE", help="Port spec (default: the bundled BERT-like example).")
@click.option("--weights", metavar="CKPT", help="Torch checkpoint to load into torch_model() first.")
@click.option("--converted", metavar="FILE", help="Paddle weights (.pdparams/.safetensors) to load as is.")
@click.option("--mapping", metavar="NAME|FILE", help="Rule set for converting in memory and pairing layers.")
@click.option("--device", type=click.Choice(api.DEVICES), default="auto", show_default=True)
@click.option("--precision", "precision_mode", type=click.Choice(api.PRECISIONS), default="as-is",
              show_default=True, help="strict turns TF32 off on both sides.")
@click.option("--emulate", multiple=True, metavar="SIDE=MODE",
              help="Make SIDE (torch|paddle) round matmul/conv inputs to MODE (tf32|bf16|fp16).")
@click.option("--bisect", is_flag=True, help="Name the first layer over budget and diagnose it.")
@click.option("--strategy", type=click.Choice(api.STRATEGIES), default="auto", show_default=True)
@click.option("--json", "json_path", metavar="FILE", help="Write the report as JSON.")
@click.option("--html", "html_path", metavar="FILE", help="Write a self-contained HTML report.")
@click.option("--rows", default=60, show_default=True, type=click.IntRange(0, 1_000_000), help="Table rows to print.")
@click.option("--force", is_flag=True, help="Replace existing --json/--html files.")
@click.option("--train", is_flag=True, help="Also check training: loss, backward, optimizer and N steps.")
@click.option("--steps", default=api.DEFAULT_STEPS, show_default=True, help="Training steps for --train.")
@click.option("--emit-optimizer", metavar="FILE", help="With --train: write paddle's translated optimizer as code.")
@click.option("--max-memory", metavar="SIZE", help="The most memory the run may hold, e.g. 6GiB or 6500MiB (powers "
              "of 1024); it streams the weights and keeps fewer blocks to stay within it. Default: what is available.")
@click.option("--quiet", is_flag=True, help="No progress line on stderr (it is drawn only on a terminal).")
@click.option("--threshold", metavar="T", help="A fixed tolerance you hold (e.g. 1e-5): the report says where the "
              "arithmetic each side used cannot hold it, and whether the run's errors are within it.")
@one_line_errors
def verify_port(directories, spec_path, weights, converted, mapping, device, precision_mode, emulate, bisect,
                strategy, json_path, html_path, rows, force, train, steps, emit_optimizer, max_memory, quiet, threshold):
    """Run the torch model and its paddle port, compare every layer against its expected-error
    budget, and (with --bisect) name the first layer over budget with a diagnosis.

    With HF_DIR PADDLE_DIR instead of a spec: transformers' model from HF_DIR against PaddleFormers'
    (or PaddleNLP's) from PADDLE_DIR, as convert-weights HF_DIR PADDLE_DIR wrote it."""
    if directories:  # HF_DIR PADDLE_DIR: both directories, and none of the options that only a spec takes
        options = _options(device, precision_mode, emulate, strategy, bisect, train, steps, max_memory, threshold)
        if len(directories) != 2:
            raise UserError(f"verify-port takes two directories, HF_DIR PADDLE_DIR; got {len(directories)} "
                            f"({', '.join(map(repr, directories))}); give both, or a spec with --spec")
        taken = [name for name, value in (("--spec", spec_path), ("--weights", weights), ("--converted", converted),
                                           ("--emit-optimizer", emit_optimizer)) if value]
        if taken:
            raise UserError(f"HF_DIR PADDLE_DIR build both models from their directories; {', '.join(taken)} "
                            f"{'is an option' if len(taken) == 1 else 'are options'} of a spec: give the directories "
                            "or a spec, not both")
        check_outputs({"--json": json_path, "--html": html_path}, [*directories, mapping], force)
        with progress.shown(progress_shown(quiet)):
            report = api.verify_directories(*directories, options, mapping=mapping, log=say)
        _report(report, rows, None, json_path, html_path, force)
    if weights and not os.path.exists(weights):
        raise UserError(f"--weights '{weights}' does not exist")
    if converted and not os.path.exists(converted):
        raise UserError(f"--converted '{converted}' does not exist")
    if spec_path is None:
        spec_path = BUNDLED
        say(f"no --spec given: verifying the bundled example port ({os.path.basename(BUNDLED)})")
    if emit_optimizer and not train:
        raise UserError("--emit-optimizer writes the optimizer --train translates; add --train")
    outputs = {"--json": json_path, "--html": html_path, "--emit-optimizer": emit_optimizer}
    check_outputs(outputs, [spec_path, weights, converted, mapping], force)
    spec = api.PortSpec.from_file(spec_path)
    if not mapping and isinstance(spec.mapping, str):  # the spec's own rule file is an input too
        check_outputs(outputs, [spec.mapping], force)
    options = _options(device, precision_mode, emulate, strategy, bisect, train, steps, max_memory, threshold)
    if emit_optimizer:
        api.translated_optimizer(spec)  # nothing to write is bad input, said before the checks run
    with progress.shown(progress_shown(quiet)):
        report = api.verify_port(spec, options, weights=weights, converted=converted, mapping=mapping)
    _report(report, rows, emit_optimizer, json_path, html_path, force)


UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def memory_size(text: str) -> int:
    """--max-memory's SIZE in bytes: a number with K, M, G or T (powers of 1024; KiB, KB and K alike)."""
    from fractions import Fraction

    from ..errors import MAX_SIZE, shown_value
    match = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    size = int(Fraction(match.group(1)) * UNITS[match.group(2).upper()]) if match else 0  # exact, no float
    if not 1 <= size < MAX_SIZE:  # more than any machine's memory: refused as such
        raise UserError(f"--max-memory takes a size above 0 (and below 4 EiB) such as 6GiB, 6.5G or 6500MiB (powers of 1024); got "
                        f"{shown_value(text)}")
    return size


def tolerance(text: str) -> float:
    """--threshold's T: a finite number above 0, such as 1e-5."""
    from ..errors import shown_value
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"--threshold takes a tolerance above 0 such as 1e-5 or 0.0001; got {shown_value(text)}")
    return value


def _report(report, rows, emit_optimizer, json_path, html_path, force) -> None:
    """Print the report, write its files, exit by its verdict."""
    click.echo(render_text(report, max_rows=rows))
    optimizer_code = report.train.optimizer_code if emit_optimizer else None
    write_outputs({emit_optimizer: optimizer_code, json_path: render_json(report) if json_path else None,
                   html_path: render_html(report) if html_path else None}, force)  # all of them or none
    if optimizer_code is not None:
        click.echo(f"paddle's optimizer written to {emit_optimizer}", err=True)
    sys.exit(report.exit_code)


def _options(device, precision, emulate, strategy, bisect, train, steps, max_memory, threshold) -> api.VerifyOptions:
    """The API's options from the command's; a value they refuse is said in the command's words."""
    given = {tuple(value.partition("=")[::2]): value for value in emulate}  # (side, mode) -> SIDE=MODE
    try:
        return api.VerifyOptions(device=device, precision=precision, emulate=dict(given.keys()), strategy=strategy,
                                 bisect=bisect, train=train, steps=steps if train else api.DEFAULT_STEPS,
                                 max_memory=None if max_memory is None else memory_size(max_memory),
                                 threshold=None if threshold is None else tolerance(threshold))
    except api.OptionError as exc:
        if exc.option == "emulate":
            raise UserError("--emulate takes SIDE=MODE with SIDE torch or paddle and MODE tf32, bf16 or fp16; "
                            f"got '{given[exc.value]}'") from None
        if exc.option == "steps":
            value = str(exc.value) if len(str(exc.value)) <= 40 else f"{str(exc.value)[:40]}... ({len(str(exc.value))} digits)"
            raise UserError(f"--steps takes 1 to {api.MAX_STEPS} steps; got {value}") from None
        raise

