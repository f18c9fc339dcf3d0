"""``openenv-gym serve`` whose busy-poll selectors count their waits: at exit, ``{"selectors", "polled", "slept"}`` as JSON to ``$COUNTS_PATH``.

    COUNTS_PATH=counts.json python -m tests.servers.counting_busy_poll serve CartPole-v1 --busy-poll 500 ...
"""

from __future__ import annotations

import json
import os
import sys

from openenv_gym.cli import main
from openenv_gym.server import busy_poll

made: list[busy_poll.BusyPollSelector] = []
real_init = busy_poll.BusyPollSelector.__init__


def counted_init(self: busy_poll.BusyPollSelector, window: float) -> None:
    real_init(self, window)
    made.append(self)


if __name__ == "__main__":
    busy_poll.BusyPollSelector.__init__ = counted_init  # type: ignore[method-assign]
    try:
        code = main(sys.argv[1:])
    finally:
        counts = {"selectors": len(made), "polled": sum(s.polled for s in made), "slept": sum(s.slept for s in made), "yielded": sum(s.yielded for s in made)}
        with open(os.environ["COUNTS_PATH"], "w") as out:
            json.dump(counts, out)
    sys.exit(code)
