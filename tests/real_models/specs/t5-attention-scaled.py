"""Real-model case t5-attention-scaled: attention logits scaled by 1/sqrt(d_kv) (T5 does not scale them) (tests/real_models/cases.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cases import spec_functions  # noqa: E402

torch_model, paddle_model, inputs, mapping = spec_functions("t5-attention-scaled")
