from setuptools import setup

setup(
    name="torch2paddle-port",
    version="0.1.0",
    description="Convert PyTorch checkpoints to PaddlePaddle and verify the port layer by layer",
    python_requires=">=3.9",
    packages=["converter", "converter.io", "converter.rules", "converter.families",
              "converter.frameworks", "converter.hf", "converter.verify", "converter.compare", "converter.train", "converter.cli",
              "converter.examples", "converter.mappings"],
    package_dir={"converter.mappings": "mappings"},
    package_data={"converter.mappings": ["*.json"]},
    # google-re2: rule patterns are matched in linear time (no pattern can hang a conversion);
    # isal: ISA-L's CRC-32 checks a torch zip's storages at about four times zlib's speed
    install_requires=["numpy", "safetensors", "click", "tqdm", "google-re2", "isal"],
    extras_require={
        # torch and paddle are optional at import time; [cpu] brings both CPU builds,
        # [gpu] only paddlepaddle-gpu so that a user's own CUDA torch is never replaced.
        "cpu": ["torch", "paddlepaddle"],
        "gpu": ["paddlepaddle-gpu"],
        # hypothesis: the property-based hostile-input tests; atheris: the coverage-guided
        # fuzz targets in scripts/ (tests run each target's entry point on its seed corpus);
        # ruff: the lint CI runs before the tests (settings in pyproject.toml); pytest-xdist:
        # the fast subset on both cores (-n 2)
        "test": ["pytest", "hypothesis", "atheris", "ruff", "pytest-xdist"],
    },
    entry_points={
        "console_scripts": [
            "convert-weights=converter.cli:main_convert",
            "verify-port=converter.cli:main_verify",
        ]
    },
)
