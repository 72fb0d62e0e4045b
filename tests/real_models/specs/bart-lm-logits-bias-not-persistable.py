"""Real-model case bart-lm-logits-bias-not-persistable: final_logits_bias not persistable, never loaded (tests/real_models/cases.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cases import spec_functions  # noqa: E402

torch_model, paddle_model, inputs, mapping = spec_functions("bart-lm-logits-bias-not-persistable")
