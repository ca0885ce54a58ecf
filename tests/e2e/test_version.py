"""The version is written once: ``flor --version`` prints it, and ``setup.py --version`` reads it
without importing flor.
"""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT


def test_flor_version_prints_the_version_and_exits_0():
    from flor import __version__

    out = subprocess.run([sys.executable, "-m", "flor", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"flor {__version__}" == "flor 0.1.0"


def test_setup_py_reads_the_version_without_importing_flor():
    text = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert "flor/_version.py" in text.replace('" / "', "/") and "import flor" not in text
    out = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    from flor import __version__

    assert out.stdout.strip().splitlines()[-1] == __version__
