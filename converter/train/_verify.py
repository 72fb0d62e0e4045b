"""Everything the training checks take from the forward verifier, in one place: a rename there
is a one-line change here."""

from __future__ import annotations

from ..compare.budget import MARGIN, Budget, budget_from_error, tail  # noqa: F401
from ..frameworks import paddle_side  # noqa: F401
from ..compare.capture import Recorder, flatten, record  # noqa: F401
from ..compare.metrics import compare  # noqa: F401
from ..compare.replay import TorchCopies, force_paddle_args  # noqa: F401
from ..verify.report import Diagnosis  # noqa: F401
from ..compare.precision import FORMATS, U32, UNIT_ROUNDOFF, round_array, round_torch  # noqa: F401
from ..compare.session import Options, PortSession  # noqa: F401
