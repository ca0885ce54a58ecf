from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="flor",
    version="0.1.0",
    description="Hindsight logging for PyTorch training: record once, add log statements later, replay.",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["flor", "flor.*"]),
    python_requires=">=3.9",
    # torch is required but not pinned here: install the build you want first
    # (on CPU-only machines: pip install torch==2.13.0 before this package).
    install_requires=["torch>=2.0", "numpy>=1.22", "xxhash>=3.0", "cloudpickle>=2.0"],
    extras_require={
        "pandas": ["pandas>=1.5"],
        "test": ["pytest>=7", "hypothesis>=6", "pandas>=1.5", "scikit-learn>=1.1"],
        "examples": ["scikit-learn>=1.1"],
    },
    entry_points={"console_scripts": ["flor = flor.cli:main"]},
    classifiers=["License :: OSI Approved :: Apache Software License", "Programming Language :: Python :: 3"],
)
