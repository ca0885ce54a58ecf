import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
# the version is written once, in flor/_version.py; read as text so building never imports flor (or torch)
VERSION = re.search(r'^__version__ = "([^"]+)"', (HERE / "flor" / "_version.py").read_text(encoding="utf-8"), re.M)[1]

setup(
    name="flor",
    version=VERSION,
    description="Hindsight logging for PyTorch training: record once, add log statements later, replay.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["flor", "flor.*"]),
    python_requires=">=3.9",
    # torch is required but not pinned here: install the build you want first
    # (on CPU-only machines: pip install torch==2.13.0 before this package).
    # tensorboard: to view the event files flor writes (flor.logs.tensorboard); tqdm: progress bars
    install_requires=["torch>=2.0", "numpy>=1.22", "xxhash>=3.0", "cloudpickle>=2.0", "tensorboard>=2.10", "tqdm>=4.60"],
    extras_require={
        "pandas": ["pandas>=1.5"],
        "s3": ["boto3>=1.36"],
        # flor plot / flor compare --plot
        "plot": ["matplotlib>=3.5"],
        # kept so that existing `pip install -e '.[tensorboard]'` commands still work: tensorboard is core now
        "tensorboard": [],
        # flor replay --ray: one Ray task per replay segment (docs/parallel.md)
        "ray": ["ray>=2.9"],
        # flor export --to mlflow / wandb (docs/export.md); imported only by the exporters
        "mlflow": ["mlflow>=2.10"],
        "wandb": ["wandb>=0.17"],
        # flor.integrations: FlorCallback for Lightning's Trainer (docs/lightning.md) and Hugging Face's (docs/transformers.md)
        # (either namespace: `lightning.pytorch` of the unified package, or `pytorch_lightning`)
        "lightning": ["lightning>=2.6", "pytorch-lightning>=2.6"],
        "transformers": ["transformers>=5.0", "accelerate>=1.0"],
        # the S3 tests start a real S3-compatible server (moto's) on 127.0.0.1
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "pandas>=1.5", "scikit-learn>=1.1", "boto3>=1.36", "moto[server]>=5",
                 "matplotlib>=3.5",
                 # tests/test_launch_ray.py; Ray installs in ~20 s (one 80 MB wheel), the test is skipped without it
                 "ray>=2.9",
                 # tests/e2e/test_export.py: a real MLflow store (SQLite, and `mlflow server`), W&B offline
                 "mlflow>=2.10", "wandb>=0.17",
                 # tests/e2e/test_frameworks.py: real Lightning and Hugging Face Trainers on the CPU
                 "lightning>=2.6", "pytorch-lightning>=2.6", "transformers>=5.0", "accelerate>=1.0",
                 # `ruff check flor && mypy flor` (pyproject.toml), run by .ci/run before the tests; the oldest
                 # versions seen to pass (older mypy releases, with older typeshed stubs, report false errors)
                 "ruff>=0.6", "mypy>=2.2"],
        "examples": ["scikit-learn>=1.1"],
    },
    entry_points={"console_scripts": ["flor = flor.cli:main"]},
    classifiers=["License :: OSI Approved :: Apache Software License", "Programming Language :: Python :: 3"],
)
