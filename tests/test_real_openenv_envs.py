"""OpenEnv's own environments, each served by its own ``server/app.py`` as shipped, checked with the URL alone.

Opt-in: skipped unless ``OPENENV_ENVS`` names the ``envs/`` folder of a
checkout of huggingface/OpenEnv, with the envs' own dependencies installed in
this Python (chess, moonfish, smolagents, ale-py, dm_control, mujoco,
open-spiel, reasoning-gym, textarena, nltk, matplotlib). ``OPENENV_ENVS_PYTHONS``
may name, as a JSON object, the Python of an env whose dependencies cannot
live beside the others (``{"snake_env": ".../bin/python"}``: gym 0.24.1 and
marlenv), and ``OPENENV_ENVS_COMMIT`` the checkout's commit where it is no git
work tree. Each env gets 8 copies of its app (OpenEnv's apps allow one session
a server unless they read ``MAX_CONCURRENT_ENVS``), and ``openenv-gym
check`` of them: 50 random steps, ``check_env``, a pool of 8 envs for 30
steps, and the override it finds where the schema cannot say enough. The
table it writes replaces the one in ``docs/guides/openenv-envs.md``; the run also
fails where an env that passed before does not.

    OPENENV_ENVS=/path/to/OpenEnv/envs python -m pytest tests/test_real_openenv_envs.py -s
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ENVS = os.environ.get("OPENENV_ENVS")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "guides" / "openenv-envs.md"
BEGIN, END = "<!-- compatibility table: begin -->", "<!-- compatibility table: end -->"

pytestmark = pytest.mark.skipif(not ENVS, reason="set OPENENV_ENVS to the envs/ folder of a huggingface/OpenEnv checkout")


@dataclass
class Serving:
    """How one env is served: its app (``module:app``), the folder it is imported from, its settings."""

    app: str
    app_dir: str | None = None
    environ: dict[str, str] = field(default_factory=dict)
    note: str = ""


#: Module names are relative to OPENENV_ENVS (on PYTHONPATH with the checkout's root), as OpenEnv's README runs them.
SERVED = {
    "grid_world_env": Serving("grid_world_env.server.app:app"),
    "connect4_env": Serving("connect4_env.server.app:app"),
    "chess_env": Serving("chess_env.server.app:app"),
    "coding_env": Serving("coding_env.server.app:app"),
    "carla_env": Serving("carla_env.server.app:app", note="CARLA_MODE=mock, its default (no simulator)"),
    "repl_env": Serving("repl_env.server.app:app"),
    "textarena_env": Serving(
        "textarena_env.server.app:app",
        environ={"TEXTARENA_ENV_ID": "GuessTheNumber-v0", "TEXTARENA_DOWNLOAD_NLTK": "0"},
        note="GuessTheNumber-v0: the default Wordle-v0 downloads a corpus",
    ),
    "wildfire_env": Serving("wildfire_env.server.app:app"),
    "reasoning_gym_env": Serving("reasoning_gym_env.server.app:app"),
    "maze_env": Serving("maze_env.server.app:app"),
    "atari_env": Serving("atari_env.server.app:app"),
    "openspiel_env": Serving("openspiel_env.server.app:app"),
    "snake_env": Serving(
        "server.app:app",
        app_dir="snake_env",
        note="from its own folder (its in-repo import path is broken), in a venv of its own (gym 0.24.1, marlenv)",
    ),
    "dm_control_env": Serving("dm_control_env.server.app:app"),
    "chat_env": Serving("chat_shim:app", note="the env's own MockTokenizer (its default tokenizer is a hub download)"),
    "echo_env": Serving("echo_env.server.app:app"),
    "dipg_safety_env": Serving("dipg_safety_env.server.app:app", note="broken for the stock client too"),
    "sumo_rl_env": Serving("sumo_rl_env.server.app:app", note="broken for the stock client too"),
    "calendar_env": Serving("calendar_env.server.app:app", note="no /ws or /schema: not an OpenEnv WebSocket server"),
}

#: A module that serves chat_env with the MockTokenizer of its own test file (imported from the checkout at run time).
CHAT_SHIM = """
import chat_env.server.app as chat_app
from chat_env.server.test_chat_env import MockTokenizer

chat_app.get_tokenizer = MockTokenizer
app = chat_app.app
"""

COPIES = 8


def _python_for(name: str) -> str | None:
    pythons = json.loads(os.environ.get("OPENENV_ENVS_PYTHONS", "{}"))
    return pythons.get(name)


def _run_one(name: str, serving: Serving, shim_dir: str) -> dict:
    """``openenv-gym check`` of ``COPIES`` copies of the env, in a child process (an env may leave threads behind)."""
    envs = Path(ENVS).resolve()
    environ = {
        "PYTHONPATH": os.pathsep.join([shim_dir, str(envs), str(envs.parent)]),
        **serving.environ,
    }
    app_dir = str(envs / serving.app_dir) if serving.app_dir else None
    script = textwrap.dedent(
        f"""
        import json, sys
        import openenv_gym
        from openenv_gym.check import check
        try:
            with openenv_gym.launch_local({serving.app!r}, stock=True, app_dir={app_dir!r}, servers={COPIES},
                                          environ={environ!r}, python={_python_for(name)!r}, startup_timeout=180) as urls:
                report = check(urls, steps=50, num_envs={COPIES}, pool_steps=30, step_timeout=120)
                out = report.to_json()
        except Exception as exc:
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            why = lines[-1] if len(lines) > 1 else ""  # (a LaunchError's log tail ends with the reason)
            out = {{"urls": [], "ok": False, "served": False, "error": f"{{type(exc).__name__}}: {{why[:200] or lines[0][:200]}}"}}
        print("REPORT " + json.dumps(out))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1200, env={**os.environ, **environ})
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("REPORT ")), None)
    if line is None:
        return {"ok": False, "served": False, "error": (done.stderr.strip().splitlines() or ["no report"])[-1][:300]}
    return json.loads(line[len("REPORT ") :])


def _row(name: str, serving: Serving, report: dict) -> str:
    if report.get("served") is False:
        return f"| {name} | not served here | – | – | – | – | {report.get('error', '')[:160]} |"
    findings = {f["name"].split(":")[0]: f for f in report["findings"]}

    def cell(prefix: str) -> str:
        f = next((v for k, v in findings.items() if k.startswith(prefix)), None)
        if f is None:
            return "–"
        if f["ok"]:
            return "pass"
        if f.get("env_side"):
            return "env ignores the seed"
        return "fail: " + f["detail"][:100].replace("|", "/")

    override = "; ".join(f"`{k}={v}`" for k, v in report.get("overrides", {}).items()) or "none"
    verdict = "**URL alone**" if report["ok"] and override == "none" else "one override" if report["ok"] else "fails"
    return f"| {name} | {verdict} | {cell('single env')} | {cell('gymnasium check_env')} | {cell('pool')} | {override} | {serving.note} |"


@pytest.mark.timeout(6 * 3600)  # (19 envs, 8 servers each, one after the other: opt-in, never in CI)
def test_openenv_s_own_envs_work_with_the_url_alone_or_the_one_override_check_prints():
    rows: list[str] = []
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as shim_dir:
        Path(shim_dir, "chat_shim.py").write_text(CHAT_SHIM)
        for name, serving in SERVED.items():
            if not (Path(ENVS) / name).is_dir():
                continue
            report = _run_one(name, serving, shim_dir)
            results[name] = report
            rows.append(_row(name, serving, report))
            print(rows[-1], flush=True)
    commit = (
        os.environ.get("OPENENV_ENVS_COMMIT")
        or subprocess.run(
            ["git", "-C", str(Path(ENVS).parent), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    table = "\n".join(
        [
            BEGIN,
            f"Run on {datetime.date.today()} against huggingface/OpenEnv at `{commit or 'unknown'}`, {COPIES} copies of each app "
            f"(`tests/test_real_openenv_envs.py`).",
            "",
            "| env | verdict | single env, 50 random steps | check_env | pool of 8, 30 steps | override `check` found | how it was served |",
            "|---|---|---|---|---|---|---|",
            *rows,
            END,
        ]
    )
    text = DOCS.read_text()
    DOCS.write_text(text[: text.index(BEGIN)] + table + text[text.index(END) + len(END) :])
    passing = [n for n, r in results.items() if r.get("ok")]
    alone = [n for n in passing if not results[n].get("overrides")]
    print(f"{len(alone)} with the URL alone, {len(passing) - len(alone)} with one override, of {len(results)}")
    assert len(alone) >= 14 and len(passing) >= 16
