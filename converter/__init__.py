"""Tools for porting PyTorch models to PaddlePaddle.

`convert-weights` moves a checkpoint across through declarative mapping rules;
`verify-port` runs both models and names the first layer whose own error is
over its expected-error budget.  torch and paddle are imported lazily, only by
the code paths that need them.

The public API (converter.api) and its result and error types are importable from here, each
module on first use, so that `import converter` stays light.
"""

__version__ = "0.1.0"

# name -> the module (under converter) that defines it
_EXPORTS = {
    "PortSpec": "api", "VerifyOptions": "api", "verify_port": "api", "verify_directories": "api",
    "translated_optimizer": "api",
    "convert_weights": "api", "convert_directory": "api", "converts_a_directory": "api",
    "DirectoryConversion": "api", "OptionError": "api",
    "PortReport": "report", "Verdict": "results",
    "Report": "verify.report", "LayerResult": "verify.report", "TrainReport": "train.result",
    "ConversionResult": "convert", "Diagnosis": "diagnosis",
    "PortError": "errors", "UserError": "errors", "CheckFailed": "errors",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        from importlib import import_module
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'converter' has no attribute '{name}'")


def __dir__():
    return sorted(list(globals()) + __all__)
