"""Small Gymnasium environments for the server tests, registered on import.

Serve them as ``tests.servers.gym_envs:<Id>`` (``gymnasium.make`` imports the
module first):

* ``Frames-v0`` -- an Atari-sized frame stack: observation ``Box(0, 255,
  (84, 84, 4), uint8)``, action ``Discrete(4)``; reward = the action; ends
  (terminated) after ``episode_length`` steps (default 10); empty ``info``.
  Frames are drawn from the env's seeded ``np_random``.
* ``Slow-v0`` -- observation ``Box(-1, 1, (2,), float32)``, action
  ``Discrete(2)``; ``step`` sleeps ``delay`` seconds (default 0.5) first.
* ``Nested-v0`` -- Dict/Tuple observation and Dict action, to check that
  spaces travel exactly; ``info`` holds a numpy array.
* ``Flaky-v0`` -- like ``Slow-v0`` without the sleep, but ``step`` raises
  ``RuntimeError("flaky step")`` when the action is 1, and ``reset`` raises
  when ``options["fail"]`` is true.
* ``ActionSleep-v0`` -- ``step(a)`` sleeps ``a * delay`` seconds (default
  0.5): action 0 answers at once, action 1 late.
* ``Hand-v0`` -- a card game with ``Sequence`` spaces: observation
  ``Dict(hand=Sequence(Discrete(52)), trail=Sequence(Box(-1, 1, (2,)),
  stack=True), score=Box((), float32))``, action ``Sequence(Discrete(8))``:
  the positions of the cards to discard (others ignored); an empty discard
  draws a card. Ends (terminated) when the hand is empty.
* ``OutOfRange-v0`` -- observation space ``Box(0, 255, (2,), uint8)`` whose
  steps return int64 ``[300, 1]``: a value the space's dtype cannot hold.
* ``OddInfo-v0`` -- infos that no codec or batch takes as they are: a
  uint64 above int64's range (5 for seed 0), ``2**70``, long doubles.
* ``Pair-v0`` -- a ``Tuple(Discrete(3), Text(5))`` observation; episodes of
  3 steps.
* ``ResetCrash-v0`` -- episodes of one step (terminated); the first env,
  in any process, to reset a second time after ``marker`` (a path) is
  claimed kills its server process (``os._exit``): a server lost between
  an episode end and the reset that follows it.
* ``SlowMake-v0`` -- instant steps; once ``marker`` (a path) exists, making
  an env (a new session) takes ``make_delay`` seconds (default 0.3).
* ``InfoTerminated-v0`` -- instant steps, episodes cut by a time limit of 3
  steps, and ``info == {"terminated": True}``: an info key, not the flag.
* ``TypedInfo-v0`` -- ``info["v"]`` is the int 1 in envs seeded below 2,
  whose steps sleep ``delay`` seconds (default 0.2), and the float 2.5 in
  the others: Gymnasium types an info key's array by the first env.
* ``InfoCartPole-v1`` -- ``CartPole-v1`` whose ``info`` carries an int, a
  float, a bool and an array on steps and an int on resets (odd steps only
  add ``"odd"``), to check that infos batch exactly as in ``SyncVectorEnv``.
* ``NumpyInfoCartPole-v1`` -- ``CartPole-v1`` whose ``info`` holds numpy
  scalars (float32, int32, bool, uint8; float16 and float64 in a nested
  dict): their dtypes type the batched arrays.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["FramesEnv", "SlowEnv", "NestedEnv", "FlakyEnv", "HandEnv", "InfoCartPole", "FRAME_SHAPE"]

FRAME_SHAPE = (84, 84, 4)


class FramesEnv(gym.Env):
    """An 84x84x4 uint8 observation, as a frame-stacked Atari env has."""

    metadata = {"render_modes": []}

    def __init__(self, episode_length: int = 10) -> None:
        self.observation_space = spaces.Box(0, 255, FRAME_SHAPE, np.uint8)
        self.action_space = spaces.Discrete(4)
        self.episode_length = episode_length
        self._t = 0

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, FRAME_SHAPE, dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._frame(), {}

    def step(self, action: int):
        self._t += 1
        return self._frame(), float(action), self._t >= self.episode_length, False, {}


class SlowEnv(gym.Env):
    """Each step blocks for ``delay`` seconds (as a simulator or remote call may)."""

    metadata = {"render_modes": []}

    def __init__(self, delay: float = 0.5) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.delay = delay

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: int):
        time.sleep(self.delay)
        return np.full(2, 0.5, np.float32), 1.0, False, False, {}


class NestedEnv(gym.Env):
    """Dict and Tuple spaces, non-finite bounds, and numpy values in ``info``."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-np.inf, np.inf, (3,), np.float64),
                "mode": spaces.Discrete(3, start=-1),
                "pair": spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(4))),
            }
        )
        self.action_space = spaces.Dict({"move": spaces.Box(-1.0, 1.0, (2,), np.float32), "fire": spaces.Discrete(2)})
        self._pos = np.zeros(3)

    def _obs(self) -> dict[str, Any]:
        return {
            "pos": self._pos.copy(),
            "mode": np.int64(int(self._pos[0] > 0) - 1),
            "pair": (np.int64(1), np.array([1, 0, 1, 0], np.int8)),
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._pos = self.np_random.normal(size=3)
        return self._obs(), {"origin": np.zeros(2, np.float32), "options": options}

    def step(self, action: dict[str, Any]):
        self._pos[:2] += action["move"]
        return self._obs(), float(action["fire"]), False, False, {"moved": np.asarray(action["move"])}


class ResetCrashEnv(SlowEnv):
    """One-step episodes; one second reset, in the first process to claim ``marker``, kills that process."""

    def __init__(self, marker: str) -> None:
        super().__init__(delay=0.0)
        self.marker = marker
        self._resets = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._resets += 1
        if self._resets >= 2:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os._exit(17)
        return super().reset(seed=seed, options=options)

    def step(self, action: int):
        return np.full(2, 0.5, np.float32), 1.0, True, False, {}


class SlowMakeEnv(SlowEnv):
    """Instant steps; once ``marker`` (a path) exists, making an env takes ``make_delay`` seconds."""

    def __init__(self, marker: str, make_delay: float = 0.3) -> None:
        super().__init__(delay=0.0)
        if os.path.exists(marker):
            time.sleep(make_delay)


class InfoTerminatedEnv(SlowEnv):
    """Instant steps that never end an episode, whose ``info`` says ``{"terminated": True}``: only a key."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)

    def step(self, action: int):
        return np.full(2, 0.5, np.float32), 1.0, False, False, {"terminated": True}


class NonFiniteRewardEnv(SlowEnv):
    """Instant steps whose reward is NaN, +inf or -inf for actions 0, 1 and 2."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)
        self.action_space = spaces.Discrete(3)

    def step(self, action: int):
        return np.full(2, 0.5, np.float32), [math.nan, math.inf, -math.inf][int(action)], False, False, {}


class OpenIntEnv(SlowEnv):
    """Integer spaces with open bounds: actions ``>= 0`` (no upper bound), observations unbounded; the obs is the action."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.int64)
        self.action_space = spaces.Box(0, np.inf, (2,), np.int64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(2, np.int64), {}

    def step(self, action: Any):
        return np.asarray(action, np.int64), 0.0, False, False, {}


class TypedInfoEnv(SlowEnv):
    """``info["v"]``: 1 (and slow steps) in envs seeded below 2, else 2.5."""

    def __init__(self, delay: float = 0.2) -> None:
        super().__init__(delay=delay)
        self._low = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._low = seed < 2
        return super().reset(seed=seed, options=options)

    def step(self, action: int):
        if self._low:
            time.sleep(self.delay)
        return np.zeros(2, np.float32), 1.0, False, False, {"v": 1 if self._low else 2.5}


class FlakyEnv(SlowEnv):
    """``step(1)`` raises; ``step(0)`` works and is instant."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if options and options.get("fail"):
            raise RuntimeError("flaky reset")
        return super().reset(seed=seed, options=options)

    def step(self, action: int):
        if action == 1:
            raise RuntimeError("flaky step")
        return super().step(action)


class ActionSleepEnv(SlowEnv):
    """``step(a)`` sleeps ``a * delay`` seconds; ``a`` in ``Discrete(actions)``."""

    def __init__(self, delay: float = 0.5, actions: int = 2) -> None:
        super().__init__(delay)
        self.action_space = spaces.Discrete(actions)

    def step(self, action: int):
        time.sleep(int(action) * self.delay)
        return self.observation_space.sample(), 1.0, False, False, {}


class SlowEpisodeEnv(SlowEnv):
    """Reset and step each block for ``delay`` seconds; an episode ends after ``length`` steps."""

    def __init__(self, delay: float = 0.5, length: int = 1) -> None:
        super().__init__(delay=delay)
        self.length = length
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        time.sleep(self.delay)
        self._t = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: int):
        time.sleep(self.delay)
        self._t += 1
        return np.full(2, 0.5, np.float32), 1.0, self._t >= self.length, False, {}


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("this exception cannot be printed")


class UnprintableErrorEnv(SlowEnv):
    """``step(1)`` raises an exception whose ``str()`` raises too; ``step(0)`` works."""

    def __init__(self) -> None:
        super().__init__(delay=0.01)

    def step(self, action: int):
        time.sleep(self.delay)
        if action == 1:
            raise Unprintable()
        return np.full(2, 0.5, np.float32), 1.0, False, False, {}


class HandEnv(gym.Env):
    """Observations and actions whose length varies: ``Sequence`` spaces."""

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "hand": spaces.Sequence(spaces.Discrete(52)),
                "trail": spaces.Sequence(spaces.Box(-1.0, 1.0, (2,), np.float32), stack=True),
                "score": spaces.Box(0.0, 100.0, (), np.float32),
            }
        )
        self.action_space = spaces.Sequence(spaces.Discrete(8))
        self._hand: list[int] = []
        self._trail: list[np.ndarray] = []

    def _obs(self) -> dict[str, Any]:
        trail = np.array(self._trail, np.float32).reshape(len(self._trail), 2)
        return {"hand": tuple(self._hand), "trail": trail, "score": np.array(len(self._hand), np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._hand = [int(c) for c in self.np_random.integers(0, 52, 3)]
        self._trail = []
        return self._obs(), {}

    def step(self, action: tuple[int, ...]):
        gone = {int(i) for i in action}
        if gone:
            self._hand = [c for i, c in enumerate(self._hand) if i not in gone]
        else:
            self._hand.append(int(self.np_random.integers(0, 52)))
        self._trail.append(self.np_random.uniform(-1, 1, 2).astype(np.float32))
        return self._obs(), float(len(gone)), not self._hand, False, {}


class OutOfRangeEnv(gym.Env):
    """Observation space ``Box(0, 255, (2,), uint8)``; reset obeys it, every step returns int64 ``[300, 1]``."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 255, (2,), np.uint8)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.array([1, 2], np.uint8), {}

    def step(self, action: int):
        return np.array([300, 1], np.int64), 0.0, False, False, {}


class HugeFloatEnv(gym.Env):
    """Observation space ``Box(-inf, inf, (2,), float32)``; steps return float64 ``[1e300, -1e300]``, beyond float32 (read as ``[inf, -inf]``)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: int):
        return np.array([1e300, -1e300]), 0.0, False, False, {}


class OddInfoEnv(gym.Env):
    """Infos no codec or batch takes as they are: a uint64 above int64 (for seeds other than 0; 5 for seed 0),
    an int beyond msgpack's range, long doubles."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._big: Any = 5

    def _info(self) -> dict[str, Any]:
        return {"big": self._big, "huge": 2**70, "ld": np.longdouble(1.5), "lda": np.array([1.5, 2.5], np.longdouble)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._big = 5 if not seed else np.uint64(2**64 - 1)
        return np.zeros(2, np.float32), self._info()

    def step(self, action: int):
        return np.zeros(2, np.float32), 1.0, False, False, self._info()


class ClashingInfoEnv(gym.Env):
    """Infos Gymnasium's batching cannot take: for seed 0 a key beside its own mask's name
    (``{"a": 1.0, "_a": {"b": 2}}``), for seed 1 a map where seed 0's env sent a number, else ``{"a": 3.0}``."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._info: dict[str, Any] = {"a": 3.0}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._info = {"a": 1.0, "_a": {"b": 2}} if seed == 0 else {"a": {"x": 1}} if seed == 1 else {"a": 3.0}
        return np.zeros(2, np.float32), dict(self._info)

    def step(self, action: int):
        return np.zeros(2, np.float32), 1.0, False, False, dict(self._info)


class PairEnv(gym.Env):
    """A ``Tuple(Discrete(3), Text(5))`` observation (not all arrays); episodes of 3 steps (terminated)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Tuple((spaces.Discrete(3), spaces.Text(5)))
        self.action_space = spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return (0, "s0"), {}

    def step(self, action: int):
        self._t += 1
        return (self._t % 3, f"s{self._t}a{int(action)}"), 1.0, self._t >= 3, False, {}


class InfoCartPole(gym.Wrapper):
    """CartPole-v1 with a varied ``info`` on every reset and step."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self._steps = 0
        self._resets = 0

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._steps = 0
        self._resets += 1
        return obs, {**info, "resets": self._resets}

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._steps += 1
        info = {**info, "steps": self._steps, "speed": float(obs[1]), "left": bool(action == 0), "obs": obs.copy()}
        if self._steps % 2:
            info["odd"] = self._steps
        return obs, reward, terminated, truncated, info


class LevelCartPole(gym.Wrapper):
    """CartPole-v1 whose reset info tells the ``level`` reset option it got (-1 for none)."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, {**info, "level": int((options or {}).get("level", -1))}


class ActionTypesEnv(gym.Env):
    """Its info names the Python type of each action leaf it gets (and whether it hashes, as ``table[action]`` needs)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Dict(
            {
                "pick": spaces.Discrete(3),
                "small": spaces.Discrete(4, dtype=np.int32),
                "knob": spaces.Box(-1.0, 1.0, (), np.float32),
                "pair": spaces.Tuple((spaces.Discrete(2), spaces.MultiDiscrete([5, 2]))),
            }
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: dict[str, Any]):
        leaves = {
            "pick": action["pick"],
            "small": action["small"],
            "knob": action["knob"],
            "pair0": action["pair"][0],
            "pair1": action["pair"][1],
        }
        info = {}
        for name, value in leaves.items():
            try:
                hash(value)
                hashes = True
            except TypeError:
                hashes = False
            info[name] = f"{type(value).__name__} {getattr(value, 'dtype', '')} {hashes}"
        return np.zeros(1, np.float32), 0.0, False, False, info


class DeepInfoEnv(SlowEnv):
    """Instant steps; ``step(1)``'s info nests 2,000 maps deep (more than any reply can carry), ``step(0)``'s is plain."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)

    def step(self, action: int):
        info: dict[str, Any] = {"plain": 1}
        if action == 1:
            deep: dict[str, Any] = {}
            for _ in range(2000):
                deep = {"a": deep}
            info = {"deep": deep}
        return np.full(2, 0.5, np.float32), 1.0, False, False, info


class FileNameEnv(gym.Env):
    """A ``Text`` observation and an info holding lone surrogates, as ``os.fsdecode`` gives for non-UTF-8 file names."""

    def __init__(self) -> None:
        self.observation_space = spaces.Text(16)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return "start", {"file": os.fsdecode(b"log-\xff.txt")}

    def step(self, action: int):
        return "step", 1.0, False, False, {"file": os.fsdecode(b"run-\xfe\xff.txt"), "plain": "ok"}


class TrailEnv(gym.Env):
    """A stacked ``Sequence`` observation: each step adds a row to an array of shape ``(k, 2)``; 3-step episodes."""

    def __init__(self) -> None:
        self.observation_space = spaces.Sequence(spaces.Box(-1.0, 1.0, (2,), np.float32), stack=True)
        self.action_space = spaces.Discrete(2)
        self._trail = np.zeros((1, 2), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._trail = self.np_random.uniform(-1, 1, (1, 2)).astype(np.float32)
        return self._trail.copy(), {}

    def step(self, action: int):
        row = np.full((1, 2), 0.5 if action else -0.5, np.float32)
        self._trail = np.concatenate([self._trail, row])
        return self._trail.copy(), 1.0, len(self._trail) > 3, False, {}


class DeepEndEnv(SlowEnv):
    """Two-step episodes whose last step's info nests 2,000 maps deep (no reply can hold it); its reset info counts resets."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)
        self._resets = 0
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._resets += 1
        self._t = 0
        return np.zeros(2, np.float32), {"resets": self._resets}

    def step(self, action: int):
        self._t += 1
        info: dict[str, Any] = {}
        if self._t == 2:
            for _ in range(2000):
                info = {"a": info}
        return np.full(2, 0.1 * self._t, np.float32), 1.0, self._t == 2, False, info


class NumpyInfoCartPole(gym.Wrapper):
    """CartPole-v1 whose ``info`` holds numpy scalars of several dtypes, one in a nested dict."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self._steps = 0

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._steps = 0
        return obs, {**info, "start": np.float32(obs[0]), "flag": np.bool_(False)}

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._steps += 1
        info = {
            **info,
            "angle": np.float32(obs[2]),
            "steps": np.int32(self._steps),
            "left": np.bool_(action == 0),
            "byte": np.uint8(self._steps % 256),
            "inner": {"half": np.float16(obs[1]), "wide": np.float64(obs[3])},
            "pair": obs[:2].copy(),
            "pairs": [obs[:2].copy(), {"deep": [obs[2:].copy()]}],
        }
        return obs, reward, terminated, truncated, info


for _id, _cls in (
    ("Frames-v0", FramesEnv),
    ("Slow-v0", SlowEnv),
    ("Nested-v0", NestedEnv),
    ("Hand-v0", HandEnv),
    ("OutOfRange-v0", OutOfRangeEnv),
    ("HugeFloat-v0", HugeFloatEnv),
    ("OddInfo-v0", OddInfoEnv),
    ("ClashingInfo-v0", ClashingInfoEnv),
    ("Pair-v0", PairEnv),
    ("Flaky-v0", FlakyEnv),
    ("ResetCrash-v0", ResetCrashEnv),
    ("TypedInfo-v0", TypedInfoEnv),
    ("NonFiniteReward-v0", NonFiniteRewardEnv),
    ("OpenInt-v0", OpenIntEnv),
    ("SlowMake-v0", SlowMakeEnv),
    ("InfoCartPole-v1", InfoCartPole),
    ("NumpyInfoCartPole-v1", NumpyInfoCartPole),
    ("LevelCartPole-v1", LevelCartPole),
    ("ActionTypes-v0", ActionTypesEnv),
    ("DeepInfo-v0", DeepInfoEnv),
    ("FileName-v0", FileNameEnv),
    ("Trail-v0", TrailEnv),
    ("DeepEnd-v0", DeepEndEnv),
    ("ActionSleep-v0", ActionSleepEnv),
    ("SlowEpisode-v0", SlowEpisodeEnv),
    ("UnprintableError-v0", UnprintableErrorEnv),
):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_cls)
if "InfoTerminated-v0" not in gym.registry:
    gym.register("InfoTerminated-v0", entry_point=InfoTerminatedEnv, max_episode_steps=3)


def make_slow_env(delay: float = 0.0) -> SlowEnv:
    """A factory (not a registered id): ``openenv-gym serve tests.servers.gym_envs:make_slow_env``."""
    return SlowEnv(delay=delay)


def make_nothing() -> object:
    """A factory that returns no env: serving it fails at startup."""
    return object()
