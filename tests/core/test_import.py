"""`import tiermem` stays light: no torch, no matplotlib."""

from __future__ import annotations

import subprocess
import sys


def test_import_pulls_in_no_torch_or_matplotlib() -> None:
    code = "import sys, tiermem; print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


def test_version_and_public_names() -> None:
    import tiermem

    assert tiermem.__version__
    for name in tiermem.__all__:
        assert hasattr(tiermem, name), name
