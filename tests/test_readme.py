"""The Python snippets of the README and the docs run as written (against a local server where they name one).

Every README snippet runs. A docs snippet runs when it needs nothing but this
machine: it starts its own servers (``launch_local``) or names the local
server, ``http://127.0.0.1:8000``; the others show a deployment (hosts,
tokens of other machines) and are read, not run (a page marks one that would
match but cannot run here as ``{code-block} python``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from openenv_gym import launch_local

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
THEIR_SERVER = "http://127.0.0.1:8000"  # what the snippets that need a running server name
DOC_BLOCKS = [
    block
    for page in sorted((ROOT / "docs").rglob("*.md"))
    for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    if "launch_local(" in block or THEIR_SERVER in block
]


@pytest.fixture(scope="module")
def server_url():
    with launch_local("CartPole-v1", max_sessions=64) as (url,):
        yield url


def test_the_readme_has_its_snippets():
    assert len(BLOCKS) >= 3 and any(THEIR_SERVER in block for block in BLOCKS)


#: Optional extras a snippet may import: its test is skipped where the extra is not installed.
OPTIONAL = {"stable_baselines3": "sb3", "torchrl": "torchrl"}


def _runs(block: str, server_url: str) -> None:
    for module, extra in OPTIONAL.items():
        if f"import {module}" in block or f"from {module}" in block:
            pytest.importorskip(module, reason=f"the {extra} extra is not installed")
    code = block.replace(THEIR_SERVER, server_url)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, f"snippet failed:\n{code}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_snippet_runs(index, server_url):
    _runs(BLOCKS[index], server_url)


@pytest.mark.parametrize("index", range(len(DOC_BLOCKS)))
def test_a_docs_snippet_runs(index, server_url):
    _runs(DOC_BLOCKS[index], server_url)
