"""The README's Python snippets run as written (against a local server where they name one)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from openenv_gym.server import launch_local

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
THEIR_SERVER = "http://127.0.0.1:8000"  # what the snippets that need a running server name


@pytest.fixture(scope="module")
def server_url():
    with launch_local("CartPole-v1", max_sessions=64) as (url,):
        yield url


def test_the_readme_has_its_snippets():
    assert len(BLOCKS) >= 4 and any(THEIR_SERVER in block for block in BLOCKS)


#: Optional extras a snippet may import: its test is skipped where the extra is not installed.
OPTIONAL = {"stable_baselines3": "sb3", "torchrl": "torchrl"}


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_snippet_runs(index, server_url):
    for module, extra in OPTIONAL.items():
        if f"import {module}" in BLOCKS[index] or f"from {module}" in BLOCKS[index]:
            pytest.importorskip(module, reason=f"the {extra} extra is not installed")
    code = BLOCKS[index].replace(THEIR_SERVER, server_url)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"README snippet {index} failed:\n{code}\n{done.stderr[-3000:]}"
