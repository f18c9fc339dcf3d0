"""``openenv-gym bench`` end to end, with tiny settings, on real local servers.

Each study runs once (module-scoped fixtures) through ``main(argv)``, the
entry point of the console script; the tests then read its printed tables,
its JSON and its plot.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from openenv_gym import launch_local
from openenv_gym.bench import CountingRelay, ProgressBar, measure, plot_available
from openenv_gym.bench.frames import FRAME_BYTES
from openenv_gym.bench.runners import stock_available
from openenv_gym.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HAS_STOCK = stock_available()
HAS_PLOT = plot_available()


def run_bench(args: list[str]) -> tuple[int, str, str]:
    """``main(["bench", *args])``: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["bench", *args])
    return code, out.getvalue(), err.getvalue()


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in ``text`` (header and separator excluded)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| setup") and not line.startswith("| sessions"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def plot_args(path: Path) -> list[str]:
    return ["--plot", str(path)] if HAS_PLOT else []


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("bench")
    out_json, out_png = tmp / "bench.json", tmp / "bench.png"
    args = [
        "--num-envs",
        "4",
        "--seconds",
        "0.3",
        "--trials",
        "1",
        "--batch-size",
        "2",
        "--unix",
        "--busy-poll",
        "300",
        "--ceiling",
        "--json",
        str(out_json),
    ]
    if hasattr(os, "sched_setaffinity"):
        args.append("--pin-cpus")
    code, out, err = run_bench(args + plot_args(out_png))
    return {"code": code, "out": out, "err": err, "json": json.loads(out_json.read_text()), "png": out_png}


EXPECTED_SETUPS = [
    "pool, fast path (2 servers)",
    "pool, fast path (2 servers), send/recv batch 2",
    "pool, fast path (2 servers, Unix sockets)",
    "pool, fast path (2 servers, busy-polling 300 us)",
    "pool, fast path (2 servers), openenv_gym/Null-v0: no env work",
    *(["pool, stock server (JSON)", "stock client, stock server"] if HAS_STOCK else []),
    "gymnasium SyncVectorEnv",
    "gymnasium AsyncVectorEnv",
]


def test_default_run_prints_a_row_for_every_setup_with_positive_throughput(default_run):
    assert default_run["code"] == 0, default_run["err"]
    rows = {row[0]: row for row in table_rows(default_run["out"])}
    assert list(rows) == EXPECTED_SETUPS
    for row in rows.values():
        assert float(row[1].replace(",", "")) > 0  # steps/s


def test_default_run_shows_progress_on_stderr(default_run):
    assert "bench:" in default_run["err"]
    assert f"{1 + 1 * len(EXPECTED_SETUPS)}/{1 + len(EXPECTED_SETUPS)}" in default_run["err"]


def test_default_run_json_has_every_setup_and_metric(default_run):
    report = default_run["json"]
    assert report["machine"]["cores"] >= 1 and report["machine"]["python"]
    compare = report["compare"]
    assert compare["env_id"] == "CartPole-v1" and compare["num_envs"] == 4 and compare["batch_size"] == 2
    assert compare["pin_cpus"] is hasattr(os, "sched_setaffinity")
    assert ("local servers pinned one per CPU" in default_run["out"]) is compare["pin_cpus"]
    assert [s["name"] for s in compare["setups"]] == EXPECTED_SETUPS
    for setup in compare["setups"]:
        assert setup["error"] is None
        assert setup["steps_per_s"] > 0
        assert 0 < setup["p50_ms"] <= setup["p99_ms"]
        assert setup["cpu_us_per_step"] > 0
        assert len(setup["trials"]) == 1
    assert report["sweep"] is None and report["frames"] is None


@pytest.mark.skipif(not HAS_PLOT, reason="matplotlib is not installed (the plot extra)")
def test_default_run_draws_a_png(default_run):
    data = default_run["png"].read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_url_measures_the_given_servers(tmp_path):
    out_json = tmp_path / "url.json"
    with launch_local("CartPole-v1", servers=1, max_sessions=8) as (url,):
        code, out, err = run_bench(["--url", url, "--num-envs", "3", "--seconds", "0.2", "--trials", "1", "--json", str(out_json)])
    assert code == 0, err
    assert [row[0] for row in table_rows(out)] == ["pool, fast path (1 server)"]
    compare = json.loads(out_json.read_text())["compare"]
    assert compare["urls"] == [url] and compare["env_id"] is None
    (setup,) = compare["setups"]
    assert setup["steps_per_s"] > 0 and setup["calls"] >= 1


def test_url_of_a_server_with_a_token_takes_it_from_the_environment(monkeypatch):
    token = "bench-" + "x" * 30
    with launch_local("CartPole-v1", servers=1, max_sessions=4, token=token) as (url,):
        args = ["--url", url, "--num-envs", "2", "--seconds", "0.2", "--trials", "1"]
        monkeypatch.delenv("OPENENV_GYM_TOKEN", raising=False)
        code, _, err = run_bench(args)
        assert code == 1 and "401" in err  # refused without it
        monkeypatch.setenv("OPENENV_GYM_TOKEN", token)
        code, out, err = run_bench(args)
    assert code == 0, err
    assert token not in out + err
    assert [row[0] for row in table_rows(out)] == ["pool, fast path (1 server)"]


def test_url_that_does_not_answer_fails_with_exit_code_1():
    code, _, err = run_bench(["--url", "http://127.0.0.1:9", "--num-envs", "1", "--seconds", "0.1", "--trials", "1"])
    assert code == 1 and "openenv-gym bench:" in err


def test_url_with_sweep_is_a_usage_error():
    code, _, err = run_bench(["--url", "http://127.0.0.1:9", "--sweep"])
    assert code == 2 and "--url" in err


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("sweep")
    out_json, out_png = tmp / "sweep.json", tmp / "sweep.png"
    args = ["--sweep", "--sweep-sizes", "2,6", "--sweep-sleep-ms", "2", "--sweep-rounds", "2", "--sweep-servers", "1"]
    code, out, err = run_bench(args + ["--no-progress", "--json", str(out_json)] + plot_args(out_png))
    return {"code": code, "out": out, "err": err, "json": json.loads(out_json.read_text()), "png": out_png}


def test_sweep_prints_a_row_per_size_and_the_largest_good_size(sweep_run):
    assert sweep_run["code"] == 0, sweep_run["err"]
    assert sweep_run["err"] == ""  # --no-progress
    assert [row[0] for row in table_rows(sweep_run["out"])] == ["2", "6"]
    assert "Largest size with >= 95% success" in sweep_run["out"]


def test_sweep_json_has_success_rates_latencies_and_verdicts(sweep_run):
    sweep = sweep_run["json"]["sweep"]
    clients = ["stock client", "pool"] if HAS_STOCK else ["pool"]
    assert sweep["clients"] == clients and sweep["sizes"] == [2, 6] and sweep["sleep_ms"] == 2
    assert sweep["fd_limit"]["enough"] is True
    assert len(sweep["points"]) == 2 * len(clients)
    for point in sweep["points"]:
        assert 0.0 <= point["success_rate"] <= 1.0
        assert point["requests"] == point["sessions"] * point["rounds"] and 1 <= point["rounds"] <= 2
        assert point["successes"] == point["requests"]  # tiny loads on loopback: every request succeeds
        assert point["p99_s"] >= 0.002  # at least the env's sleep
        assert point["steps_per_s"] > 0
    assert sweep["max_sessions_ok"] == {client: 6 for client in clients}


@pytest.mark.skipif(not HAS_PLOT, reason="matplotlib is not installed (the plot extra)")
def test_sweep_draws_a_png(sweep_run):
    assert sweep_run["png"].read_bytes().startswith(PNG_MAGIC)


def test_frames_measures_time_and_bytes_on_the_wire(tmp_path):
    out_json = tmp_path / "frames.json"
    code, out, err = run_bench(["--frames", "--frames-envs", "1", "--seconds", "0.2", "--trials", "1", "--json", str(out_json)])
    assert code == 0, err
    names = ["pool, fast path", *(["pool, stock server (JSON)", "stock client, stock server (JSON)"] if HAS_STOCK else [])]
    assert [row[0] for row in table_rows(out)] == names
    rows = {r["name"]: r for r in json.loads(out_json.read_text())["frames"]["rows"]}
    fast = rows["pool, fast path"]
    # Raw bytes plus a small header each way.
    assert FRAME_BYTES <= fast["bytes_down_per_step"] < FRAME_BYTES * 1.01
    assert 0 < fast["bytes_up_per_step"] < 1_000
    assert fast["steps_per_s"] > 0
    if HAS_STOCK:
        # A frame as a JSON list of ints: every byte becomes 1 to 3 digits and a separator.
        assert rows["pool, stock server (JSON)"]["bytes_down_per_step"] > 3 * FRAME_BYTES
        assert rows["pool, stock server (JSON)"]["steps_per_s"] > 0


def test_measure_is_bounded_in_calls_and_makes_at_least_one():
    stats = measure(lambda k: None, 4, 10.0, warmup_calls=0, max_calls=50)
    assert stats.calls == 50 and stats.env_steps == 200
    slow = measure(lambda k: None, 1, 1e-9, warmup_calls=0)
    assert slow.calls >= 1 and slow.steps_per_s > 0


def test_relay_forwards_loopback_only():
    with pytest.raises(ValueError, match="loopback"):
        CountingRelay("http://192.0.2.1:8000")


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_progress_bar_redraws_one_line_on_a_terminal():
    stream = _Stream(tty=True)
    bar = ProgressBar("bench", stream, width=10)
    bar(0, 4, "start")
    bar(2, 4, "half")
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "[#####.....] 2/4" in text


def test_progress_bar_writes_plain_lines_elsewhere():
    stream = _Stream(tty=False)
    bar = ProgressBar("bench", stream)
    bar(1, 3, "a")
    bar(1, 3, "a")  # unchanged: not repeated
    bar(2, 3, "b")
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("bench: 1/3") and lines[1].endswith("b")


@pytest.mark.skipif(not HAS_STOCK, reason="the stock OpenEnv server is not installed")
def test_stock_setups_may_get_several_stock_servers():
    code, out, err = run_bench(["--num-envs", "4", "--seconds", "0.2", "--trials", "1", "--stock-servers", "2", "--no-progress"])
    assert code == 0, err
    rows = {row[0]: row for row in table_rows(out)}
    for name in ("pool, 2 stock servers (JSON)", "stock client, 2 stock servers"):
        assert float(rows[name][1].replace(",", "")) > 0
