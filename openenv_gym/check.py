"""``openenv-gym check``: drive any OpenEnv server as a user would, and say what works and what to pass where it does not.

:func:`check` reads the server's ``/schema``, says where each field went
(the observation, ``info``, a flag, the action, or left to the server) and
why, then plays it: random steps through :class:`~openenv_gym.OpenEnvEnv`,
Gymnasium's ``check_env``, and a small :class:`~openenv_gym.OpenEnvVectorEnv`.
Where the schema cannot say what the env takes (an integer with no range, a
list with no length) it probes the env, one value at a time on a session of
its own, and proposes the override that says it; then it plays again with
the overrides it found, so that each one it prints is one it saw work.

Random actions are ``action_space.sample()``, masked by ``info["action_mask"]``
where the env lists its legal actions.
"""

from __future__ import annotations

import math
import re
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from .errors import CapacityError, OpenEnvGymError, ServerError
from .remote import SCHEMA_EXTENSION, RemoteSpaces, fetch_schema
from .spaces import BoundedSequence, SpaceMappingError, UnboundedInteger, UnsizedSequence

__all__ = ["Finding", "CheckReport", "check"]

#: Values of an integer with no range probed one by one, from 0, before the probe doubles its way up.
_LINEAR_PROBES = 32
#: Largest integer the probe tries.
_MAX_PROBE = 2**31 - 1
#: Lengths of a list with no length probed, from 1.
_LENGTH_PROBES = 16
#: Terminal colour codes (Gymnasium's warnings carry them).
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Finding:
    """One check's outcome.

    Attributes:
        name: what was checked (``"single env: 50 random steps"``).
        ok: whether it passed.
        detail: what happened (the error, counts).
        hint: what to try, when it failed and something can be tried.
        env_side: it failed for a reason of the env's that no client or
            override can change (its reset ignores the seed); it does not
            fail the report.
    """

    name: str
    ok: bool
    detail: str = ""
    hint: str = ""
    env_side: bool = False


@dataclass
class CheckReport:
    """What :func:`check` found about a server.

    Attributes:
        urls: the servers checked.
        protocol: ``"openenv_gym"`` (the server publishes exact spaces) or ``"stock"``.
        observation_space, action_space: the spaces (``repr``), with the overrides.
        fields: one entry per schema field: ``field``, ``role`` (``observation``
            or ``action``), ``goes`` (``observation``, ``info``, ``flag``,
            ``reward``, ``action``, ``server``) and ``why``.
        findings: the checks, in order.
        overrides: the keyword arguments that made the checks pass (Python
            source, for ``OpenEnvEnv`` and ``OpenEnvVectorEnv``), empty when none was needed.
        ok: every check passed (with the overrides), or failed for the env's own reasons only (``Finding.env_side``).
    """

    urls: list[str]
    protocol: str = "stock"
    observation_space: str = ""
    action_space: str = ""
    fields: list[dict[str, str]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    overrides: dict[str, str] = field(default_factory=dict)
    ok: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the report."""
        return asdict(self)

    def text(self) -> str:
        """The report as ``openenv-gym check`` prints it."""
        lines = [f"openenv-gym check {' '.join(self.urls)}  ({self.protocol} server)"]
        if self.observation_space:
            lines += [f"observation space: {self.observation_space}", f"action space:      {self.action_space}", ""]
        if self.fields:
            width = max(len(f["field"]) for f in self.fields)
            lines.append("fields:")
            for f in self.fields:
                lines.append(f"  {f['role']:<11} {f['field']:<{width}}  -> {f['goes']:<11} {f['why']}")
            lines.append("")
        lines.append("checks:")
        for finding in self.findings:
            mark = "ok  " if finding.ok else "env " if finding.env_side else "FAIL"
            lines.append(f"  {mark}  {finding.name}" + (f": {finding.detail}" if finding.detail else ""))
            if finding.hint and not finding.ok:
                lines.append(f"        {'note' if finding.env_side else 'try'}: {finding.hint}")
        if self.overrides:
            lines += ["", "overrides that made it work:"]
            lines += [f"  {key}={value}" for key, value in self.overrides.items()]
        lines += ["", "OK" if self.ok else "FAILED"]
        return "\n".join(lines)


def check(
    urls: str | Sequence[str],
    *,
    steps: int = 50,
    num_envs: int = 8,
    pool_steps: int = 30,
    seed: int = 0,
    probe: bool = True,
    headers: Mapping[str, str] | None = None,
    connect_timeout: float = 10.0,
    step_timeout: float = 60.0,
    **overrides: Any,
) -> CheckReport:
    """Drive the server(s) at ``urls`` as a user would; what works, and the overrides where something does not.

    Args:
        urls: one server, or several hosting the same env (the single env
            uses the first; the pool all of them).
        steps: random steps of the single env (0: none).
        num_envs: envs of the pool (0: no pool check).
        pool_steps: steps of the pool.
        seed: the seed of the resets and of the action samples.
        probe: where the schema does not say what the env takes, probe it
            (a few dozen steps on a session of its own) and retry with the
            override found.
        headers, connect_timeout, step_timeout: as for :class:`~openenv_gym.OpenEnvEnv`.
        **overrides: ``OpenEnvEnv`` keyword arguments to check with
            (``action_space=``, ``variable_fields=``, ...).

    Returns:
        the :class:`CheckReport`; it never raises for what the server does.
    """
    urls = [urls] if isinstance(urls, str) else list(urls)
    report = CheckReport(urls=urls)
    options: dict[str, Any] = dict(headers=headers, connect_timeout=connect_timeout, step_timeout=step_timeout)
    try:
        schema = fetch_schema(urls[0], headers=headers, timeout=connect_timeout)
    except OpenEnvGymError as exc:
        report.findings.append(Finding("read /schema", False, _said(exc), "is the URL an OpenEnv server's (GET /schema)?"))
        return report
    report.protocol = "openenv_gym" if isinstance(schema.get(SCHEMA_EXTENSION), dict) else "stock"
    given = dict(overrides)
    probed: Any = None  # the action space the probe found, if it did
    for _ in range(5):  # (each round may find one more override, or narrow the probed one)
        findings, spaces, found, refused = _play(urls, schema, options, given, steps, num_envs, pool_steps, seed, probe)
        if "action_space" in found:
            probed = found["action_space"]
        elif refused is not None and probed is not None and given.get("action_space") is probed:  # (the one it found)
            # A sample of the range the probe found was refused: a hole in it (the surrogates of a chr() tokenizer).
            narrowed = _narrowed(urls[0], options, given["action_space"], refused)
            if narrowed is not None:
                found["action_space"] = probed = narrowed
        if not found or all(given.get(k) is v for k, v in found.items()):
            break
        given.update(found)
        report.overrides.update({k: _source(v) for k, v in found.items()})
    report.findings = findings
    if spaces is not None:
        report.observation_space = repr(spaces.observation.space)
        report.action_space = repr(spaces.action.space)
        report.fields = _fields(schema, spaces)
    report.ok = all(f.ok or f.env_side for f in findings)
    return report


def _play(
    urls: list[str],
    schema: dict[str, Any],
    options: dict[str, Any],
    overrides: dict[str, Any],
    steps: int,
    num_envs: int,
    pool_steps: int,
    seed: int,
    probe: bool,
) -> tuple[list[Finding], RemoteSpaces | None, dict[str, Any], Any]:
    """One round of the checks with ``overrides``: the findings, the spaces, overrides to try next, and an action the env refused (or ``None``)."""
    from .env import OpenEnvEnv

    findings: list[Finding] = []
    found: dict[str, Any] = {}
    refused_action: Any = None
    try:
        env = OpenEnvEnv(urls[0], **options, **overrides)
    except Exception as exc:  # (any failure is the finding: a check never raises)
        fix = getattr(exc, "fix", None)
        findings.append(Finding("open the single env (spaces from /schema)", False, _said(exc), fix or _hint_for(exc)))
        return findings, None, _parse_fix(fix), None
    spaces: RemoteSpaces = env._spaces
    with env:
        findings.append(Finding("open the single env (spaces from /schema)", True))
        if _is_tool_call(env.action_space):
            try:
                tools = env.list_tools()
                findings.append(Finding("list the MCP tools (POST /mcp tools/list)", True, ", ".join(t.name for t in tools) or "none"))
            except OpenEnvGymError as exc:  # (shaped as a tool call, but no MCP environment: nothing wrong)
                findings.append(Finding("list the MCP tools (POST /mcp tools/list)", True, f"none: no MCP environment ({_said(exc)})"))
        refused = _unsampled(env.action_space)
        if refused is not None:
            findings.append(Finding("sample the action space", False, str(refused), "an action_space= of the range the env takes"))
            if probe and "action_space" not in overrides:
                try:
                    guess, how = _probe(env, refused)
                except Exception as exc:  # (a session lost while probing, say: the finding says so)
                    guess, how = None, _said(exc)
                findings.append(Finding("probe what the env takes", guess is not None, how))
                if guess is not None:
                    found["action_space"] = guess
            return findings, spaces, found, None
        if steps:
            finding, fix, refused_action = _random_steps(env, steps, seed)
            findings.append(finding)
            found.update(_parse_fix(fix))
        findings.append(_check_env(env))
    if num_envs and not found and refused_action is None:
        finding, refused_action = _pool(urls, num_envs, pool_steps, seed, options, overrides)
        findings.append(finding)
    return findings, spaces, found, refused_action


def _random_steps(env: Any, steps: int, seed: int) -> tuple[Finding, str | None, Any]:
    """``steps`` random steps: the finding, a fix the error named, and the action the env refused (``None``: none)."""
    name = f"single env: {steps} random steps"
    env.action_space.seed(seed)
    episodes = 0
    action: Any = None
    try:
        obs, info = env.reset(seed=seed)
        for i in range(steps):
            if not env.observation_space.contains(obs):
                return Finding(name, False, f"step {i}: the observation is not in the observation space"), None, None
            action = _sample(env.action_space, info)
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                episodes += 1
                obs, info = env.reset()
    except Exception as exc:
        fix = getattr(exc, "fix", None)
        refused = action if isinstance(exc, ServerError) and exc.code == "EXECUTION_ERROR" else None
        return Finding(name, False, f"step {i}: {_said(exc)}", fix or _hint_for(exc)), fix, refused
    masked = " (masked by info['action_mask'])" if "action_mask" in info else ""
    return Finding(name, True, f"{episodes} episodes ended{masked}"), None, None


def _sample(space: gym.Space, info: Mapping[str, Any]) -> Any:
    mask = info.get("action_mask")
    if isinstance(space, gym.spaces.Discrete) and isinstance(mask, np.ndarray) and mask.shape == (space.n,):
        return space.sample(mask=mask if mask.any() else None)
    return space.sample()


def _check_env(env: Any) -> Finding:
    from gymnasium.utils.env_checker import check_env

    name = "gymnasium check_env"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_env(env.unwrapped, skip_render_check=True)
        except Exception as exc:
            text = _said(exc)
            if isinstance(exc, AssertionError) and "determinis" in text.lower():
                hint = "the env does not give the same observations for the same seed (its reset ignores the seed): the env's to fix, no override can"
                return Finding(name, False, text, hint, env_side=True)
            return Finding(name, False, text, _hint_for(exc))
    notes = sorted({_ANSI.sub("", str(w.message)).split("\n")[0][:120] for w in caught})
    return Finding(name, True, f"{len(notes)} warning(s): " + "; ".join(notes[:3]) if notes else "")


def _pool(urls: list[str], num_envs: int, steps: int, seed: int, options: dict[str, Any], overrides: dict[str, Any]) -> tuple[Finding, Any]:
    """The pool's finding, and an action the env refused (EXECUTION_ERROR) or ``None``."""
    from .vector import OpenEnvVectorEnv

    name = f"pool: {num_envs} envs on {len(urls)} server(s), {steps} steps"
    errors = 0
    first = ""
    refused: Any = None
    try:
        with OpenEnvVectorEnv(urls, num_envs, **options, **overrides) as envs:
            envs.action_space.seed(seed)
            _, infos = envs.reset(seed=seed)
            for _ in range(steps):
                actions = _sample_batch(envs.action_space, infos)
                _, _, _, _, infos = envs.step(actions)
                mask = infos.get("_openenv_error")
                if mask is not None and mask.any():
                    errors += int(mask.sum())
                    j = int(np.argmax(mask))
                    first = first or _error_of(infos["openenv_error"], j)
                    if refused is None and "EXECUTION_ERROR" in _error_of(infos["openenv_error"], j):
                        refused = actions[j]
    except Exception as exc:
        hint = _hint_for(exc)
        if isinstance(exc, CapacityError):
            hint = "more servers (pass several URLs; launch_local(..., servers=N) starts N copies of an app) or a higher session limit"
        return Finding(name, False, _said(exc), hint), None
    if errors:
        return Finding(name, False, f"{errors} env-steps truncated with info['openenv_error'], the first: {first}", ""), refused
    return Finding(name, True, "no info['openenv_error']"), None


def _error_of(errors: Any, i: int) -> str:
    """Env ``i``'s ``info["openenv_error"]`` out of a batch (a dict of arrays, as Gymnasium batches dicts), as text."""
    if isinstance(errors, Mapping):
        return f"{errors['type'][i]}: {str(errors['message'][i])[:200]}"
    return str(errors[i])[:200]


def _sample_batch(space: gym.Space, infos: Mapping[str, Any]) -> Any:
    mask = infos.get("action_mask")
    if (
        isinstance(space, gym.spaces.MultiDiscrete)
        and isinstance(mask, np.ndarray)
        and mask.shape == (*space.shape, int(space.nvec.flat[0]))
    ):
        return space.sample(mask=tuple(m if m.any() else np.ones_like(m) for m in mask))
    return space.sample()


def _is_tool_call(space: gym.Space) -> bool:
    """Whether ``space`` is the action space of a tool call (MCP's ``CallToolAction``: ``tool_name`` and ``arguments``)."""
    return isinstance(space, gym.spaces.Dict) and {"tool_name", "arguments"} <= set(space.spaces)


def _unsampled(space: gym.Space) -> SpaceMappingError | None:
    """Why ``space`` cannot be sampled (an integer with no range, a list with no length), or ``None``."""
    try:
        space.sample()
    except SpaceMappingError as exc:
        return exc
    return None


# ------------------------------------------------------------------ probing


def _probe(env: Any, refused: Exception) -> tuple[Any, str]:
    """The action space the env takes, found by trying values on a session of its own; and how it was found.

    Handles the action spaces a schema leaves open on the whole: an integer
    with no range, and a list of numbers with no length (whose items may be
    integers with no range).
    """
    space = env.action_space
    if isinstance(space, UnboundedInteger) and space.shape == ():
        return _probe_integer(env)
    if isinstance(space, (UnsizedSequence, BoundedSequence)):
        return _probe_list(env, space)
    return None, f"the open part is inside a Dict action ({refused}); pass action_space= for the whole action"


def _accepts(env: Any, action: Any) -> bool:
    """Whether the env takes ``action`` (a step that is no server error), on a fresh episode."""
    env.reset()
    try:
        env.step(action)
    except ServerError:
        return False
    return True


def _probe_integer(env: Any) -> tuple[Any, str]:
    if not _accepts(env, np.int64(0)):
        return None, "the env refused 0; pass action_space= with the range it takes"
    n = 1
    while n < _LINEAR_PROBES and _accepts(env, np.int64(n)):
        n += 1
    if n < _LINEAR_PROBES:
        return gym.spaces.Discrete(n), f"the env takes 0 to {n - 1} and refuses {n}"
    top = _highest(env, lambda k: np.int64(k), n)
    if top is None:
        return None, f"the env took every integer tried up to {_MAX_PROBE}; pass action_space= with the range it means"
    return gym.spaces.Box(0, top, (), np.int64), f"the env takes 0 to {top} (checked at the ends) and refuses {top + 1}"


def _highest(env: Any, make: Callable[[int], Any], low: int) -> int | None:
    """The largest integer ``k >= low`` whose ``make(k)`` the env takes (doubling, then halving), or ``None`` past :data:`_MAX_PROBE`."""
    good, k = low, low
    while _accepts(env, make(k)):
        good = k
        if k >= _MAX_PROBE:
            return None
        k = min(2 * k, _MAX_PROBE)
    bad = k
    while bad - good > 1:
        middle = (good + bad) // 2
        if _accepts(env, make(middle)):
            good = middle
        else:
            bad = middle
    return good


def _probe_list(env: Any, space: gym.spaces.Sequence) -> tuple[Any, str]:
    item = space.feature_space
    integers = isinstance(item, UnboundedInteger) or (isinstance(item, gym.spaces.Box) and item.dtype.kind == "i")
    zero: Any = np.int64(0) if integers else np.float64(0.0)
    lengths = [n for n in range(1, _LENGTH_PROBES + 1) if _accepts(env, tuple(zero for _ in range(n)))]
    if not lengths:
        return None, f"the env took no list of 1 to {_LENGTH_PROBES} zeros; pass action_space= for it"
    fixed = len(lengths) == 1
    if isinstance(item, UnboundedInteger):
        top = _highest(env, lambda k: (np.int64(k),) * lengths[0], 1)
        if top is None:
            return None, f"the env took every integer tried up to {_MAX_PROBE}; pass action_space= with the range it means"
        item = gym.spaces.Box(0, top, (), np.int64)
        values = f"items 0 to {top}"
    else:
        values = "items of any value (bounds of -1 to 1 assumed: the usual range of a control)"
    if fixed:
        low, high = (item.low.item(), item.high.item()) if integers and isinstance(item, gym.spaces.Box) else (-1.0, 1.0)
        dtype = np.int64 if integers else np.float64
        return gym.spaces.Box(low, high, (lengths[0],), dtype), f"the env takes lists of {lengths[0]} ({values}) only"
    most = max(lengths)
    if not integers:
        item = gym.spaces.Box(-1.0, 1.0, (), np.float64)
    return BoundedSequence(
        item, min_length=min(lengths), max_length=most
    ), f"the env takes lists of {min(lengths)} to {most} or more ({values})"


def _narrowed(url: str, options: dict[str, Any], probed: gym.Space, refused: Any) -> gym.Space | None:
    """``probed`` (an integer range the probe found) without the values from the one of ``refused``'s items the env refuses up.

    The env is asked about each integer of the refused action on its own; the
    smallest it refuses ends the range just below the run of refused values
    it starts. ``None`` where no integer of it is refused on its own.
    """
    from .env import OpenEnvEnv

    item = probed.feature_space if isinstance(probed, gym.spaces.Sequence) else probed
    if not (isinstance(item, gym.spaces.Box) and item.dtype.kind == "i" and item.shape == ()):
        return None
    try:
        values = sorted({int(v) for v in (refused if isinstance(probed, gym.spaces.Sequence) else [refused])})
    except (TypeError, ValueError):
        return None
    length = probed.min_length if isinstance(probed, BoundedSequence) else 1

    def make(k: int) -> Any:
        return (np.int64(k),) * max(length, 1) if isinstance(probed, gym.spaces.Sequence) else np.int64(k)

    try:
        with OpenEnvEnv(url, **options, action_space=probed) as env:
            bad = next((v for v in values if not _accepts(env, make(v))), None)
            if bad is None or bad <= 0:
                return None
            good, step = bad - 1, 1
            while good > 0 and not _accepts(env, make(good)):  # (down, doubling, to a value it takes)
                step *= 2
                good = max(bad - step, 0)
            top = bad
            while top - good > 1:  # (the end of the run of refused values below `bad`)
                middle = (good + top) // 2
                if _accepts(env, make(middle)):
                    good = middle
                else:
                    top = middle
    except OpenEnvGymError:
        return None
    low = int(item.low.item())
    if good < low:
        return None
    narrowed = gym.spaces.Box(low, good, (), np.int64)
    if isinstance(probed, BoundedSequence):
        return BoundedSequence(narrowed, min_length=probed.min_length, max_length=probed.max_length)
    return narrowed


# ------------------------------------------------------------------ reporting


def _fields(schema: Mapping[str, Any], spaces: RemoteSpaces) -> list[dict[str, str]]:
    """Where each top-level field of the schema went, and why."""
    out: list[dict[str, str]] = []
    obs_schema = schema.get("observation") or {}
    props = obs_schema.get("properties") if isinstance(obs_schema, dict) else None
    obs = spaces.observation
    for name in props if isinstance(props, dict) else {}:
        if name == "reward":
            goes, why = "reward", "the step's reward (0.0 where the server sends none)"
        elif name == "done":
            goes, why = "flag", "terminated, or truncated where the truncated flag says so"
        elif name == "metadata":
            goes, why = "info", "the server's metadata is the step's info"
        elif name in (spaces.truncated_key, spaces.terminated_key):
            goes, why = "flag", f"the step's {'truncated' if name == spaces.truncated_key else 'terminated'} flag"
        elif name in obs.fields:
            goes, why = "observation", repr(obs.space[name]) if isinstance(obs.space, gym.spaces.Dict) else repr(obs.space)
        elif name == spaces.legal_actions and name in obs.info_fields:
            mask = f" and info['action_mask'] ({spaces.action_mask_size} actions)" if spaces.action_mask_size else ""
            goes, why = "info", f"the legal actions: info['{name}']{mask}"
        elif name in obs.info_fields:
            goes, why = "info", "no space holds it (free-form, or null in the first observation), or obs_key= picked another field"
        else:
            goes, why = "dropped", "left out of the observation (exclude, or an explicit observation_space=)"
        out.append({"field": name, "role": "observation", "goes": goes, "why": why})
    act_schema = schema.get("action") or {}
    props = act_schema.get("properties") if isinstance(act_schema, dict) else None
    act = spaces.action
    for name in props if isinstance(props, dict) else {}:
        if name in act.fields:
            sub = act.space[name] if isinstance(act.space, gym.spaces.Dict) else act.space
            why = repr(sub)
            if isinstance(sub, gym.spaces.Discrete) and spaces.legal_actions and name == act.single_field and spaces.action_mask_size:
                why += ": bounded by the legal actions of the first observation"
            goes = "action"
        else:
            goes, why = "server", "left to the server (its default)"
        out.append({"field": name, "role": "action", "goes": goes, "why": why})
    return out


def _said(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:300]}"


def _hint_for(exc: BaseException) -> str:
    if isinstance(exc, SpaceMappingError):
        return "the message names the argument that fixes it"
    if isinstance(exc, ServerError) and exc.code == "EXECUTION_ERROR":
        return "the env refused an action the space allowed: an action_space= of what the env takes"
    if isinstance(exc, OpenEnvGymError):
        return ""
    return "a bug: please report it with this trace: " + "".join(traceback.format_exception_only(type(exc), exc)).strip()[:200]


def _parse_fix(fix: str | None) -> dict[str, Any]:
    """``"variable_fields=('legal',)"`` as keyword arguments (only the forms this module's errors write)."""
    if not fix or not fix.startswith("variable_fields=("):
        return {}
    import ast

    try:
        value = ast.literal_eval(fix.partition("=")[2])
    except (ValueError, SyntaxError):
        return {}
    return {"variable_fields": tuple(value)} if isinstance(value, tuple) and all(isinstance(v, str) for v in value) else {}


def _source(value: Any) -> str:
    """Python source that makes ``value`` (a space from :func:`_probe`, or a tuple of names)."""
    if isinstance(value, BoundedSequence):
        return f"openenv_gym.BoundedSequence({_source(value.feature_space)}, min_length={value.min_length}, max_length={value.max_length})"
    if isinstance(value, gym.spaces.Discrete):
        return f"gymnasium.spaces.Discrete({int(value.n)})"
    if isinstance(value, gym.spaces.Box):
        low, high = value.low.flat[0].item(), value.high.flat[0].item()
        return f"gymnasium.spaces.Box({_number(low)}, {_number(high)}, {tuple(value.shape)}, numpy.{value.dtype.name})"
    return repr(value)


def _number(x: float) -> str:
    return repr(int(x)) if float(x).is_integer() and not math.isinf(x) else repr(x)
