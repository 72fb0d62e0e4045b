"""The verify-port command: parse options, run, render the Report, exit by its verdict."""

from __future__ import annotations

import os
import sys

import click

from ..cli import _boundary, _say
from ..errors import UserError

BUNDLED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "bert_port.py")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
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
@_boundary
def verify_port(spec_path, weights, converted, mapping, device, precision_mode, emulate, bisect, strategy,
                json_path, html_path, rows, force):
    """Run the torch model and its paddle port, compare every layer against its expected-error
    budget, and (with --bisect) name the first layer over budget with a diagnosis."""
    from ..api import PortSpec, VerifyOptions
    from ..api import verify_port as run_verification
    from ..cli import _write_json, write_output
    from ..io.atomic import check_outputs
    from .precision import parse_emulate
    from .report import render_html, render_text

    if weights and not os.path.exists(weights):
        raise UserError(f"--weights '{weights}' does not exist")
    if converted and not os.path.exists(converted):
        raise UserError(f"--converted '{converted}' does not exist")
    if spec_path is None:
        spec_path = BUNDLED
        _say(f"no --spec given: verifying the bundled example port ({os.path.basename(BUNDLED)})")
    check_outputs({"--json": json_path, "--html": html_path}, [spec_path, weights, converted, mapping], force)
    spec = PortSpec.from_file(spec_path)
    options = VerifyOptions(device=device, precision=precision_mode, emulate=parse_emulate(emulate), strategy=strategy,
                            bisect=bisect)
    report = run_verification(spec, options, weights=weights, converted=converted, mapping=mapping)
    click.echo(render_text(report, max_rows=rows))
    if json_path:
        _write_json(json_path, report.to_json(), force)
    if html_path:
        write_output(html_path, render_html(report), force)
    sys.exit(report.exit_code)
