"""Reading checkpoints and writing converted weights.

Sources yield `TensorInfo` up front and read one tensor at a time; sinks write
a planned sequence of tensors streaming, through an atomic commit.
"""

from .base import Source, TensorInfo
from .copyrange import source_bytes
from .open import open_source, open_sink_format

__all__ = ["Source", "TensorInfo", "open_source", "open_sink_format", "source_bytes"]
