"""Tools for porting PyTorch models to PaddlePaddle.

`convert-weights` moves a checkpoint across through declarative mapping rules;
`verify-port` runs both models and names the first layer whose own error is
over its expected-error budget.  torch and paddle are imported lazily, only by
the code paths that need them.
"""

__version__ = "0.1.0"

__all__ = ["PortSpec", "VerifyOptions", "convert_weights", "verify_port"]


def __getattr__(name: str):
    """The public API (converter.api), imported on first use so that `import converter` stays light."""
    if name in __all__:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'converter' has no attribute '{name}'")


def __dir__():
    return sorted(list(globals()) + __all__)
