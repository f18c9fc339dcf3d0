"""The docs build with warnings as errors (a broken reference fails), and the README stays a short front door."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import openenv_gym

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_build_with_warnings_as_errors_and_the_api_reference_lists_every_public_name(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-n", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    api = (tmp_path / "reference" / "api.html").read_text()
    assert [name for name in openenv_gym.__all__ if f'id="openenv_gym.{name}"' not in api] == []
    cli = (tmp_path / "reference" / "cli.html").read_text()
    assert all(f"--{option}" in cli for option in ("max-sessions", "app-dir", "no-probe", "trials"))  # serve, check, bench
    assert "openenv.msgpack.v1" in (tmp_path / "PROTOCOL.html").read_text()


def test_the_readme_is_short_and_links_only_to_whole_addresses():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 12_000
    # (it is the package's description on an index too, where a relative link leads nowhere)
    assert [link for link in re.findall(r"\]\(([^)]+)\)", text) if not link.startswith("https://")] == []
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.split("&&", 1)[1].strip() in text  # (the README's test command is CI's)
