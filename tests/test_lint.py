"""The code is formatted and linted by ruff (the version and rules in pyproject.toml)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit  # (the fast tier: no sockets, no server processes)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_code_is_formatted_as_ruff_format_writes_it():
    done = _ruff("format", "--check", ".")
    assert done.returncode == 0, f"run `ruff format .`:\n{done.stdout}{done.stderr}"


def test_the_linter_finds_nothing():
    done = _ruff("check", "--output-format", "concise", ".")
    assert done.returncode == 0, f"{done.stdout}{done.stderr}"


def test_the_linter_would_see_a_fault(tmp_path):
    # (the two tests above would pass vacuously if ruff read no files, or no rules)
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nx = [1,2]\n")
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"), "--output-format", "concise", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    form = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", str(bad)], capture_output=True, text=True, timeout=120)
    assert lint.returncode == 1 and "F401" in lint.stdout
    assert form.returncode == 1
