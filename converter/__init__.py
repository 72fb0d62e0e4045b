"""Tools for porting PyTorch models to PaddlePaddle.

`convert-weights` moves a checkpoint across through declarative mapping rules;
`verify-port` runs both models and names the first layer whose own error is
over its expected-error budget.  torch and paddle are imported lazily, only by
the code paths that need them.
"""

__version__ = "0.1.0"
