"""The verify-port command: parse options, run, render the Report, exit by its verdict."""

from __future__ import annotations

import os
import sys

import click

from ..cli_common import OneLineCommand, one_line_errors, say
from ..errors import UserError

BUNDLED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "bert_port.py")


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--spec", "spec_path", metavar="FILE", help="Port spec (default: the bundled BERT-like example).")
@click.option("--weights", metavar="CKPT", help="Torch checkpoint to load into torch_model() first.")
@click.option("--converted", metavar="FILE", help="Paddle weights (.pdparams/.safetensors) to load as is.")
@click.option("--mapping", metavar="NAME|FILE", help="Rule set for converting in memory and pairing layers.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--precision", "precision_mode", type=click.Choice(["as-is", "strict"]), default="as-is",
              show_default=True, help="strict turns TF32 off on both sides.")
@click.option("--emulate", multiple=True, metavar="SIDE=MODE",
              help="Make SIDE (torch|paddle) round matmul/conv inputs to MODE (tf32|bf16|fp16).")
@click.option("--bisect", is_flag=True, help="Name the first layer over budget and diagnose it.")
@click.option("--strategy", type=click.Choice(["auto", "full", "binary"]), default="auto", show_default=True)
@click.option("--json", "json_path", metavar="FILE", help="Write the report as JSON.")
@click.option("--html", "html_path", metavar="FILE", help="Write a self-contained HTML report.")
@click.option("--rows", default=60, show_default=True, help="Table rows to print.")
@click.option("--force", is_flag=True, help="Replace existing --json/--html files.")
@click.option("--train", is_flag=True, help="Also check training: loss, backward, optimizer and N steps.")
@click.option("--steps", default=10, show_default=True, help="Training steps for --train.")
@click.option("--emit-optimizer", metavar="FILE", help="With --train: write paddle's translated optimizer as code.")
@one_line_errors
def verify_port(spec_path, weights, converted, mapping, device, precision_mode, emulate, bisect, strategy,
                json_path, html_path, rows, force, train, steps, emit_optimizer):
    """Run the torch model and its paddle port, compare every layer against its expected-error
    budget, and (with --bisect) name the first layer over budget with a diagnosis."""
    from ..api import PortSpec, VerifyOptions
    from ..api import verify_port as run_verification
    from ..cli_common import json_text
    from ..io.atomic import check_outputs, write_texts
    from ..compare.precision import parse_emulate
    from .report import render_html, render_text

    if weights and not os.path.exists(weights):
        raise UserError(f"--weights '{weights}' does not exist")
    if converted and not os.path.exists(converted):
        raise UserError(f"--converted '{converted}' does not exist")
    if spec_path is None:
        spec_path = BUNDLED
        say(f"no --spec given: verifying the bundled example port ({os.path.basename(BUNDLED)})")
    if emit_optimizer and not train:
        raise UserError("--emit-optimizer writes the optimizer --train translates; add --train")
    check_outputs({"--json": json_path, "--html": html_path, "--emit-optimizer": emit_optimizer},
                  [spec_path, weights, converted, mapping], force)
    spec = PortSpec.from_file(spec_path)
    if not mapping and spec.mapping:  # the spec's own rule file is an input too
        check_outputs({"--json": json_path, "--html": html_path, "--emit-optimizer": emit_optimizer},
                      [spec.mapping], force)
    options = VerifyOptions(device=device, precision=precision_mode, emulate=parse_emulate(emulate), strategy=strategy,
                            bisect=bisect)
    trained = None
    if train:  # the training checks, then the forward check, on one session
        from ..train.command import run_checks
        report, trained = run_checks(spec, options, steps, weights, converted, mapping, emit_optimizer)
    else:
        report = run_verification(spec, options, weights=weights, converted=converted, mapping=mapping)
    click.echo(render_text(report, max_rows=rows))
    body, page = report.to_json(), render_html(report)
    optimizer_code = None
    if trained is not None:
        from ..train.command import add_train
        body, page = add_train(trained, body, page)
        optimizer_code = trained.optimizer_code if emit_optimizer else None
    write_texts({emit_optimizer: optimizer_code, json_path: json_text(body) if json_path else None,
                 html_path: page}, force)  # all of them or none
    if optimizer_code is not None:
        click.echo(f"paddle's optimizer written to {emit_optimizer}", err=True)
    sys.exit(max(report.exit_code, trained.exit_code if trained is not None else 0))
