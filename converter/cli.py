"""Thin command-line layer: parse options, call the engine, turn results into exit codes."""

from __future__ import annotations

import os
import sys

import click

from .cli_common import OneLineCommand, one_line_errors, say
from .errors import CheckFailed, UserError


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("src")
@click.argument("dst")
@click.option("--mapping", metavar="auto|NAME|FILE", help="Shipped rule set by name, a rule file, or auto (the default "
              "without --spec): the shipped set that fits the checkpoint's keys.")
@click.option("--spec", "spec_path", metavar="FILE", help="Port spec: infer rules from the two models and check the result loads.")
@click.option("--dtype", metavar="D", help="Cast floating tensors to D (float32, float16, bfloat16).")
@click.option("--force", is_flag=True, help="Replace an existing output (only once the new file is complete).")
@click.option("--emit-mapping", metavar="FILE", help="Write the rules used, to review, edit and pass back with --mapping.")
@click.option("--json", "json_path", metavar="FILE", help="Write a JSON report.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--max-shard-size", metavar="SIZE", help="Model directories: cut the weights into shards of at most SIZE "
              "(5GB, 500MB, 2GiB) with an index; without it, shards as the source was.")
@click.option("--allow-outside-shards", is_flag=True,
              help="Read shards an index names outside its own directory (refused by default).")
@one_line_errors
def convert_weights(src, dst, mapping, spec_path, dtype, force, emit_mapping, json_path, quiet, max_shard_size,
                    allow_outside_shards):
    """Convert the torch checkpoint SRC to Paddle weights DST (.pdparams or .safetensors), or the HF model
    directory SRC to the directory DST that PaddleNLP's from_pretrained loads."""
    from .api import PortSpec
    from .api import convert_weights as run_conversion
    from .hfdir import converts_a_directory

    if converts_a_directory(src, dst):
        from .hfdir import convert_directory
        if spec_path or emit_mapping:
            raise UserError("--spec and --emit-mapping take a weights file; give SRC as its config.json's weights file")
        done = convert_directory(src, dst, mapping, dtype, force, max_shard_size, not quiet and sys.stderr.isatty(), say,
                                 json_path=json_path)
        say(f"converted {done['tensors']} tensors ({done['bytes'] / 2**20:.1f} MiB) with mapping '{done['mapping']}' "
             f"into {dst}: {', '.join(done['files'])}; every tensor checked bit for bit")
        return
    if max_shard_size:
        raise UserError("--max-shard-size applies when SRC is an HF model directory (with config.json) and DST a directory")

    spec = PortSpec.from_file(spec_path) if spec_path else None
    result = run_conversion(src, dst, mapping=mapping, spec=spec, dtype=dtype, force=force,
                            emit_mapping=emit_mapping, progress=not quiet and sys.stderr.isatty(), log=say,
                            json_path=json_path, allow_outside_shards=allow_outside_shards)
    say(f"converted {result.tensors} tensors ({result.bytes / 2**20:.1f} MiB) with mapping "
         f"'{result.mapping}' to {dst}; dropped {len(result.dropped)} key(s)")
    say("check passed: every written tensor matches its source bit for bit")
    if result.missing_keys is not None:
        if result.missing_keys or result.unexpected_keys:
            raise CheckFailed("the paddle model does not take the converted file cleanly",
                              [f"missing: {k}" for k in result.missing_keys]
                              + [f"unexpected: {k}" for k in result.unexpected_keys])
        say("loaded into the paddle model: no missing or unexpected keys")


def main_convert():
    # numpy's OpenBLAS starts a thread per core at import, which spins for a while; a conversion
    # does no linear algebra, and on two cores that thread takes CPU from the writer and the check
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    convert_weights(prog_name="convert-weights")


def main_verify():
    from .verify.command import verify_port
    verify_port(prog_name="verify-port")
