"""The package type-checks clean: it ships ``py.typed``, so its annotations are part of its API.

mypy runs with the settings in ``pyproject.toml`` (``[tool.mypy]``), at the
version the test extra pins, over ``openenv_gym/`` only.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_package_type_checks_clean(tmp_path: pathlib.Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success: no issues found" in run.stdout
    assert (ROOT / "openenv_gym" / "py.typed").exists()
