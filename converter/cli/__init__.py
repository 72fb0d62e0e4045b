"""The two commands, thin click layers over the public API (converter.api): each parses its
options, builds the API's arguments, calls it, renders the result and exits with the code the
result gives. setup.py's console scripts start main_convert and main_verify."""

from __future__ import annotations

import os

from .convert import convert_weights
from .verify import verify_port

__all__ = ["convert_weights", "verify_port", "main_convert", "main_verify"]


def main_convert():
    # numpy's OpenBLAS starts a thread per core at import, which spins for a while; a conversion
    # does no linear algebra, and on two cores that thread takes CPU from the writer and the check
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    convert_weights(prog_name="convert-weights")


def main_verify():
    verify_port(prog_name="verify-port")
