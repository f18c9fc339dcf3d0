"""The step timeline benchmark pairs each request with its server's frame and its reply: every span is a real interval."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("step_timeline", Path(__file__).parent.parent / "benchmarks" / "step_timeline.py")
step_timeline = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(step_timeline)


def test_every_span_of_a_step_is_a_positive_part_of_it():
    rate, spans = step_timeline.measure(100)
    assert rate > 0
    total = spans.pop("step() call to return")
    assert len(spans) == 11  # two of the client's before, four of each server's, one of the client's after
    for name, value in spans.items():
        assert 0 <= value < total, name  # (a request paired with another step's frame or reply gives a negative span)
    for k in (0, 1):
        assert 0 < spans[f"server {k}:   of which running the envs (run_lane)"] < spans[f"server {k}: frame, read to reply written"]


def test_the_client_hooks_are_taken_out_after_a_run():
    from openenv_gym.client import FastConnection
    from openenv_gym.client.websocket import WebSocketConnection

    before = (WebSocketConnection.__dict__["_send_message"], FastConnection.__dict__["_on_raw"])
    step_timeline.measure(10)
    assert (WebSocketConnection.__dict__["_send_message"], FastConnection.__dict__["_on_raw"]) == before


def test_servers_that_busy_poll_give_the_same_spans():
    rate, spans = step_timeline.measure(20, busy_poll=200)
    assert rate > 0
    total = spans.pop("step() call to return")
    assert len(spans) == 11
    for name, value in spans.items():
        assert 0 <= value < total, name
