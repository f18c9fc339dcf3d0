"""What the client learns about a remote environment before it opens a session.

:func:`fetch_schema` reads ``/schema`` (and :func:`fetch_health` reads ``/health``);
:func:`resolve_spaces` turns the schema and the user's overrides into the
observation and action codecs that both :class:`~openenv_gym.OpenEnvEnv` and
:class:`~openenv_gym.OpenEnvVectorEnv` use.
"""

from __future__ import annotations

import json
import math
import ssl as ssl_module
from dataclasses import dataclass, replace
from typing import Any, Collection, Mapping

import gymnasium as gym
import httpx
import numpy as np

from ._loop import LoopThread
from ._urls import http_url, is_loopback, socket_of, unix_path
from .config import Limits
from .errors import ConnectError, LimitExceeded, ServerError, refused_because
from .protocol.codec import check_json_containers
from .spaces import (
    OBSERVATION_BASE_FIELDS,
    FieldCodec,
    SchemaSpace,
    SpaceMappingError,
    UnboundedInteger,
    UnsizedSequence,
    action_space_from_schema,
    empty_open_arrays,
    fix_open_shapes,
    integer_list,
    numeric_maps,
    observation_space_from_schema,
    plain_json,
    space_codec,
    space_from_description,
    with_map_keys,
)

__all__ = [
    "SCHEMA_EXTENSION",
    "LEGAL_ACTIONS",
    "fetch_schema",
    "fetch_health",
    "RemoteSpaces",
    "resolve_spaces",
    "action_mask",
    "Tool",
    "list_tools",
]

#: Key of the ``/schema`` block in which openenv_gym servers describe exact Gymnasium spaces.
SCHEMA_EXTENSION = "x-openenv-gym"


#: Largest ``/schema`` or ``/health`` answer read, in bytes, unless told otherwise (``Limits().max_frame_bytes``).
MAX_BODY_BYTES = Limits().max_frame_bytes
#: Most lists and objects in such an answer, unless told otherwise (``Limits().max_json_containers``).
MAX_CONTAINERS = Limits().max_json_containers


def _get_json(
    base_url: str,
    endpoint: str,
    headers: Mapping[str, str] | None,
    timeout: float,
    ssl: ssl_module.SSLContext | None,
    max_bytes: int = MAX_BODY_BYTES,
    body: Any = None,
    max_containers: int = MAX_CONTAINERS,
) -> Any:
    """GET ``endpoint`` (POST ``body`` as JSON, if given) and decode its JSON answer.

    ``timeout`` (seconds) bounds the whole exchange, connect, head and body
    alike (a server that drips its answer a byte a second is cut off at it);
    the answer is read up to ``max_bytes``, and parsed if it has at most
    ``max_containers`` lists and objects. Raises :class:`ConnectError` beyond
    any of them, for an HTTP error status, and for what is no JSON.
    """
    try:
        socket_path, _ = socket_of(base_url, tls=ssl is not None)
        url = http_url(base_url, endpoint)
    except ValueError as exc:
        raise ConnectError(f"GET {endpoint} of {base_url}: {exc}", url=base_url) from None
    shown = _shown(base_url, endpoint)
    url_arg = url if socket_path is None else base_url  # what the error names as its url
    verify = ssl if ssl is not None else True

    async def fetch() -> bytes:
        async with (
            httpx.AsyncClient(
                # (identity: what is counted against max_bytes is what was sent)
                headers={"Accept-Encoding": "identity", **dict(headers or {})},
                timeout=timeout,
                verify=verify,
                trust_env=not is_loopback(base_url),
                transport=httpx.AsyncHTTPTransport(uds=socket_path, verify=verify) if socket_path is not None else None,
            ) as client,
            client.stream("GET" if body is None else "POST", url, json=body) as response,
        ):
            response.raise_for_status()
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > max_bytes:
                    raise ConnectError(f"GET {shown}: the answer is over {max_bytes} bytes (Limits.max_frame_bytes)", url=url_arg)
            return bytes(data)

    try:
        data = LoopThread.shared().run(fetch(), timeout=timeout)
    except TimeoutError:
        raise ConnectError(f"GET {shown}: no whole answer within {timeout:g} s", url=url_arg) from None
    except httpx.HTTPStatusError as exc:
        status = exc.response.status_code
        raise ConnectError(f"GET {shown} answered HTTP {status}{refused_because(status)}", url=url_arg) from None
    except httpx.HTTPError as exc:
        raise ConnectError(f"GET {shown} failed: {exc}", url=url_arg) from None
    try:
        check_json_containers(data, max_containers)
        return json.loads(data)
    except LimitExceeded as exc:
        raise ConnectError(f"GET {shown}: {exc}", url=url_arg) from None
    except ValueError as exc:
        raise ConnectError(f"GET {shown} failed: {exc}", url=url_arg) from None
    except RecursionError:  # (the json module's own bound on nesting, ~1,000 levels)
        raise ConnectError(f"GET {shown}: the answer nests too deep to read", url=url_arg) from None


def _shown(base_url: str, endpoint: str) -> str:
    """How errors name ``endpoint`` of ``base_url``: its URL, and for a Unix socket, the socket too."""
    url = http_url(base_url, endpoint)
    return url if unix_path(base_url) is None else f"{url} over {base_url.strip()}"


def fetch_schema(
    base_url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    ssl: ssl_module.SSLContext | None = None,
    max_bytes: int = MAX_BODY_BYTES,
    max_containers: int = MAX_CONTAINERS,
) -> dict[str, Any]:
    """GET ``/schema`` from the server at ``base_url`` (``timeout`` in seconds for all of it; at most ``max_bytes``, ``max_containers`` lists and objects).

    Returns the JSON object with the ``action``, ``observation`` and ``state``
    JSON Schemas and, from openenv_gym servers, the :data:`SCHEMA_EXTENSION` block.

    Raises:
        ConnectError: no answer in time, an HTTP error, an answer over
            ``max_bytes`` or nested too deep, or not an OpenEnv schema.
    """
    schema = _get_json(base_url, "/schema", headers, timeout, ssl, max_bytes, max_containers=max_containers)
    if not isinstance(schema, dict) or not isinstance(schema.get("observation"), dict):
        raise ConnectError(f"{_shown(base_url, '/schema')} did not return an OpenEnv schema", url=base_url)
    return schema


def fetch_health(
    base_url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    ssl: ssl_module.SSLContext | None = None,
    max_bytes: int = MAX_BODY_BYTES,
    max_containers: int = MAX_CONTAINERS,
) -> dict[str, Any]:
    """GET ``/health`` (``timeout`` in seconds for all of it; at most ``max_bytes``, ``max_containers`` lists and objects).

    Stock servers answer ``{"status": "healthy"}``; openenv_gym servers add
    ``active_sessions`` and ``max_sessions``.
    """
    health = _get_json(base_url, "/health", headers, timeout, ssl, max_bytes, max_containers=max_containers)
    if not isinstance(health, dict):
        raise ConnectError(f"{_shown(base_url, '/health')} did not return an object", url=base_url)
    return health


#: The observation field in which OpenEnv envs list the actions legal now (openspiel, atari, maze, connect4).
LEGAL_ACTIONS = "legal_actions"
#: Most keys of a map of numbers that becomes a ``Dict`` of ``Box`` es (more stay in ``info``).
MAX_MAP_KEYS = 256


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool of an MCP environment, as MCP's ``tools/list`` describes it.

    Attributes:
        name: what a ``call_tool`` action names (``tool_name``).
        description: what the tool does (its docstring).
        input_schema: the JSON Schema of its ``arguments``.
    """

    name: str
    description: str
    input_schema: dict[str, Any]


def list_tools(
    base_url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    ssl: ssl_module.SSLContext | None = None,
    max_bytes: int = MAX_BODY_BYTES,
    max_containers: int = MAX_CONTAINERS,
) -> list[Tool]:
    """The tools of the MCP environment at ``base_url`` (MCP's ``tools/list`` on ``POST /mcp``; ``timeout`` in seconds).

    Stock OpenEnv servers and ``openenv-gym serve`` answer it for MCP
    environments (OpenEnv's ``MCPEnvironment``, whose actions are
    ``CallToolAction``), outside any session: the tools are the env's, not an
    episode's.

    Raises:
        ConnectError: no answer in time, an HTTP error, or an answer that is no tool list.
        ServerError: the server answered with a JSON-RPC error (an env without tools).
    """
    answer = _get_json(
        base_url,
        "/mcp",
        headers,
        timeout,
        ssl,
        max_bytes,
        body={"jsonrpc": "2.0", "method": "tools/list", "params": {}, "id": 1},
        max_containers=max_containers,
    )
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict):
        raise ServerError("MCP_ERROR", f"{_shown(base_url, '/mcp')} tools/list: {error.get('message', error)!s:.200}", url=base_url)
    result = answer.get("result") if isinstance(answer, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
        raise ConnectError(f"{_shown(base_url, '/mcp')} did not return an MCP tool list", url=base_url)
    return [
        Tool(
            name=t["name"],
            description=str(t.get("description") or ""),
            input_schema=dict(next((v for k in ("input_schema", "inputSchema") if isinstance(v := t.get(k), dict)), {})),
        )
        for t in tools
    ]


@dataclass(frozen=True, slots=True)
class RemoteSpaces:
    """The spaces of a remote env and how their values map to wire fields.

    Attributes:
        observation: observation space and codec (``observation.space``).
        action: action space and codec (``action.space``).
        truncated_key: the observation or metadata field that flags truncation, if any.
        terminated_key: the observation field that flags termination, if any: with
            ``truncated_key``, a step can be both terminated and truncated (a time
            limit reached on the terminal step), which ``done`` alone cannot say.
        max_episode_steps: the time limit of the server's env, when its server says
            (openenv_gym servers of Gymnasium envs whose spec has one).
        known_fields: the observation fields the schema names; a received field
            that is none of them goes to ``info`` (empty: none is looked for).
        legal_actions: the observation field that lists the legal actions
            (:data:`LEGAL_ACTIONS`), if the schema has one; ``None`` otherwise.
        action_mask_size: ``n`` when ``info["action_mask"]`` is given: the action
            space is ``Discrete(n)`` and ``legal_actions`` names its legal values.
        needs_first_observation: some of the spaces depend on a first (reset)
            observation: call :func:`resolve_spaces` again with it.
        needs_state: the action space may depend on the env's state after
            that reset (an ``action_spec`` there): pass it too.
    """

    observation: SchemaSpace
    action: SchemaSpace
    truncated_key: str | None
    terminated_key: str | None = None
    max_episode_steps: int | None = None
    known_fields: frozenset[str] = frozenset()
    legal_actions: str | None = None
    action_mask_size: int | None = None
    needs_first_observation: bool = False
    needs_state: bool = False

    def adds_info(self, fields: Collection[str]) -> bool:
        """Whether an observation with these ``fields`` puts anything in ``info`` (see :meth:`info_of`)."""
        if self.observation.info_fields or self.action_mask_size is not None:
            return True
        known = self.known_fields
        return bool(known) and not known.issuperset(fields)

    def info_of(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """What a received observation ``payload`` adds to ``info``, besides the server's metadata.

        The fields no space holds (``SchemaSpace.info_fields``) and those the
        schema does not name, as plain JSON values (a null is left out); and
        ``action_mask``, an int8 array of ``action_mask_size`` with a 1 for each
        legal action (the others, and values out of range, 0).
        """
        info = self.observation.info_of(payload)
        known = self.known_fields
        if known:
            for name, value in payload.items():
                if name not in known and value is not None and isinstance(name, str) and not _alias_of_known(name, known):
                    info[name] = plain_json(value)
        n = self.action_mask_size
        if n is not None:
            info["action_mask"] = action_mask(payload.get(self.legal_actions or LEGAL_ACTIONS), n)
        return info


def action_mask(legal: Any, n: int) -> np.ndarray:
    """int8 ``(n,)``: 1 at each integer of ``legal`` in ``[0, n)``, 0 elsewhere (also when ``legal`` is no list)."""
    mask = np.zeros(n, dtype=np.int8)
    if isinstance(legal, np.ndarray):
        legal = legal.tolist()
    if isinstance(legal, (list, tuple)):
        for a in legal:
            if type(a) is int and 0 <= a < n:
                mask[a] = 1
    return mask


def _alias_of_known(name: str, known: frozenset[str]) -> bool:
    """Whether ``name`` is a known field sent under its Python name (the schema has its alias: ``board_size``, ``boardSize``)."""
    key = "".join(c for c in name if c.isalnum()).casefold()
    return any("".join(c for c in k if c.isalnum()).casefold() == key for k in known)


def resolve_spaces(
    schema: Mapping[str, Any],
    *,
    observation_space: gym.Space | None = None,
    action_space: gym.Space | None = None,
    obs_key: str | None = None,
    action_key: str | None = None,
    truncated_key: str | None = None,
    variable_fields: tuple[str, ...] = (),
    first_observation: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
    limits: Limits | None = None,
) -> RemoteSpaces:
    """Build the codecs from a ``/schema`` response; explicit spaces and keys win.

    From an openenv_gym server the exact spaces and field names come from the
    :data:`SCHEMA_EXTENSION` block; otherwise they are mapped from the JSON Schemas.
    Without ``truncated_key``, a boolean observation field named ``truncated``
    is taken as the truncation flag; with it and a field named ``observation``,
    one named ``terminated`` is taken as the termination flag (the shape of a
    Gymnasium env served over OpenEnv).

    The rules for spaces mapped from a stock schema (``docs/guides/openenv-envs.md``)
    that need a first observation are applied when ``first_observation`` (the
    fields of a reset's observation) is given; without it, the result says
    :attr:`RemoteSpaces.needs_first_observation` where they would apply:

    - an open-length list takes the first value's shape, but one that is
      empty there is a ``Sequence``;
    - a map of numbers (``Dict[str, List[float]]``) is a ``Dict`` of ``Box`` es
      of the first value's keys and shapes;
    - an action whose one required field is an integer with no range, beside
      a ``legal_actions`` list, is ``Discrete(1 + the largest legal action)``;
    - an action that is one list of numbers with no length is a ``Box`` of the
      shape and bounds of a dm_env-style ``action_spec`` (``shape``,
      ``minimum``, ``maximum``) in the env's ``state`` after that reset, if it
      has one (:attr:`RemoteSpaces.needs_state`).

    No array of a space is over ``limits.max_array_bytes`` (checked before it
    is made: a schema's bounds are arrays as big as its values).

    Raises:
        SpaceMappingError: a field cannot be mapped, or is over the limit; the
            message names the field and the argument that fixes it.
    """
    max_bytes = (limits or Limits()).max_array_bytes
    extension = schema.get(SCHEMA_EXTENSION)
    stock = not isinstance(extension, dict)  # (the rules for real envs apply to spaces mapped from a stock schema)
    own_obs_key = obs_key is not None
    obs_key, action_key, truncated_key, terminated_key = _field_names(schema, extension, obs_key, action_key, truncated_key)
    if isinstance(extension, dict):
        observation_space = _extension_space(extension, "observation_space", observation_space, max_bytes)
        action_space = _extension_space(extension, "action_space", action_space, max_bytes)
    flags = (terminated_key,) if terminated_key is not None else ()
    legal = LEGAL_ACTIONS if stock and obs_key != LEGAL_ACTIONS and integer_list(schema["observation"], LEGAL_ACTIONS) else None
    obs, needs_first = _observation(
        schema, observation_space, obs_key, own_obs_key, truncated_key, flags, variable_fields, legal, stock, first_observation, max_bytes
    )
    act, needs_act, needs_state = _action(schema.get("action"), action_space, action_key, legal, stock, first_observation, state, max_bytes)
    return RemoteSpaces(
        obs,
        act,
        truncated_key,
        terminated_key,
        _max_episode_steps(extension),
        known_fields=_known_fields(schema),
        legal_actions=legal,
        action_mask_size=_mask_size(act) if legal is not None else None,
        needs_first_observation=(needs_first or needs_act or needs_state) and first_observation is None,
        needs_state=needs_state and state is None,
    )


def _field_names(
    schema: Mapping[str, Any], extension: Any, obs_key: str | None, action_key: str | None, truncated_key: str | None
) -> tuple[str | None, str | None, str | None, str | None]:
    """``obs_key``, ``action_key``, ``truncated_key`` and ``terminated_key``: as given, else as the server's extension block names them, else by the observation's flag fields."""
    terminated_key = None
    if isinstance(extension, dict):
        obs_key = obs_key or _extension_name(extension, "obs_key")
        action_key = action_key or _extension_name(extension, "action_key")
        truncated_key = truncated_key or _extension_name(extension, "truncated_key")
        terminated_key = _extension_name(extension, "terminated_key")
    obs_schema = schema["observation"]
    if truncated_key is None and _is_boolean_field(obs_schema, "truncated"):
        # A boolean observation field called "truncated" says what its name says.
        truncated_key = "truncated"
    if (
        terminated_key is None
        and truncated_key == "truncated"
        and _is_boolean_field(obs_schema, "terminated")
        and "observation" in _properties(obs_schema)
    ):
        # The shape of a Gymnasium env served over OpenEnv (fields observation, truncated, terminated):
        # its "terminated" is Gymnasium's. In other envs such a field is theirs, and stays in the observation.
        terminated_key = "terminated"
    if not (isinstance(terminated_key, str) and terminated_key != truncated_key and terminated_key != obs_key):
        terminated_key = None
    return obs_key, action_key, truncated_key, terminated_key


def _extension_space(extension: Mapping[str, Any], key: str, given: gym.Space | None, max_bytes: int) -> gym.Space | None:
    """``given``, else the space the server's extension block describes under ``key`` (if any)."""
    if given is None and key in extension:
        return space_from_description(extension[key], max_array_bytes=max_bytes)
    return given


def _max_episode_steps(extension: Any) -> int | None:
    """The time limit of the server's env, as its extension block says (``None``: none said)."""
    limit = extension.get("max_episode_steps") if isinstance(extension, dict) else None
    return limit if type(limit) is int and limit > 0 else None


def _mask_size(act: SchemaSpace) -> int | None:
    """``n`` of an action space that ``legal_actions`` masks: ``Discrete(n)`` from 0, of one field; else ``None``."""
    if isinstance(act.space, gym.spaces.Discrete) and int(act.space.start) == 0 and act.single_field is not None:
        return int(act.space.n)
    return None


def _known_fields(schema: Mapping[str, Any]) -> frozenset[str]:
    """The observation fields the schema names, with the base fields (empty: it names none)."""
    reset_fields = _properties(schema.get("reset_observation"))
    known = frozenset(k for k in (*_properties(schema["observation"]), *reset_fields) if isinstance(k, str))
    return known | OBSERVATION_BASE_FIELDS if known else known


def _properties(schema: Any) -> dict[str, Any]:
    """The ``properties`` of an object schema (``{}`` where there are none)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _observation(
    schema: Mapping[str, Any],
    observation_space: gym.Space | None,
    obs_key: str | None,
    own_obs_key: bool,
    truncated_key: str | None,
    flags: tuple[str, ...],
    variable_fields: tuple[str, ...],
    legal: str | None,
    stock: bool,
    first: Mapping[str, Any] | None,
    max_bytes: int,
) -> tuple[SchemaSpace, bool]:
    """The observation's :class:`SchemaSpace`, and whether a first observation would settle more of it."""
    obs_schema = schema["observation"]
    props = _properties(obs_schema)
    names = _observation_names(props, truncated_key, flags)
    from_schema = observation_space is None
    # A list of legal actions goes to info, where it is also an action mask; alone, it is the observation, of varying length.
    to_info = (legal,) if legal is not None and from_schema and obs_key is None and len(names) > 1 else ()
    variable = tuple(variable_fields)
    if legal is not None and from_schema and not to_info and obs_key is None and legal not in variable:
        variable += (legal,)
    maps: dict[str, list[str] | None] = {}
    if stock and from_schema and obs_key is None:
        maps = {name: None for name in numeric_maps(obs_schema) if name not in flags}
    if first is not None and maps:  # (a map of numbers: a Dict of Boxes of its first keys)
        for name in maps:
            value = first.get(name)
            if isinstance(value, Mapping) and 0 < len(value) <= MAX_MAP_KEYS and all(isinstance(k, str) for k in value):
                maps[name] = sorted(value)
        obs_schema = with_map_keys(obs_schema, {name: keys for name, keys in maps.items() if keys is not None})
    if observation_space is not None:
        if variable_fields:
            raise ValueError("variable_fields= shapes spaces built from the schema; an explicit observation_space= has its own")
        obs = space_codec(observation_space, role="observation", schema=obs_schema, key=obs_key, truncated_key=truncated_key, exclude=flags)
    else:

        def mapped(variable: tuple[str, ...]) -> SchemaSpace:
            sspace = observation_space_from_schema(
                obs_schema,
                obs_key=obs_key,
                truncated_key=truncated_key,
                exclude=flags + to_info,
                variable=variable,
                max_array_bytes=max_bytes,
            )
            return replace(sspace, info_fields=sspace.info_fields + to_info) if to_info else sspace

        obs = mapped(variable)
        if first is not None and stock:
            empties = tuple(p for p in empty_open_arrays(obs, first) if p not in variable)
            if empties:  # (no shape of an empty list holds a later value: a Sequence)
                obs = mapped(variable + empties)
    needs_first = bool(maps) or obs.is_open
    if first is not None and obs.is_open:
        obs = fix_open_shapes(obs, first, max_array_bytes=max_bytes)
    if own_obs_key and obs.single_field is not None:
        # The user's obs_key picks the observation; the other fields are in info, not dropped.
        others = tuple(n for n in names if n != obs.single_field and n not in obs.info_fields)
        obs = replace(obs, info_fields=obs.info_fields + others)
    reset_schema = schema.get("reset_observation")
    if isinstance(reset_schema, dict) and reset_schema != schema["observation"]:
        reset_fields = _properties(reset_schema)
        # OpenEnv's reset_observation model: fields of the step model it lacks read as null on reset.
        obs = obs.allow_missing(set(props) - set(reset_fields))
        # And the fields only it has (an intro, the task's prompt): in a reset's info, as received.
        reset_only = sorted(set(reset_fields) - set(props) - {"done", "reward", "metadata"} - set(obs.info_fields))
        if reset_only:
            obs = replace(obs, info_fields=obs.info_fields + tuple(reset_only))
    return obs, needs_first


def _action(
    act_schema: Any,
    action_space: gym.Space | None,
    action_key: str | None,
    legal: str | None,
    stock: bool,
    first: Mapping[str, Any] | None,
    state: Mapping[str, Any] | None,
    max_bytes: int,
) -> tuple[SchemaSpace, bool, bool]:
    """The action's :class:`SchemaSpace`; whether a first observation, and the state after it, would settle more of it."""
    if action_space is not None:
        return space_codec(action_space, role="action", schema=act_schema, key=action_key), False, False
    act = action_space_from_schema(act_schema or {}, action_key=action_key, max_array_bytes=max_bytes)
    needs_first = needs_state = False
    if stock and isinstance(act.space, UnsizedSequence) and act.single_field is not None:
        needs_state = True  # (a dm_env-style action_spec in the env's state gives its length and bounds)
        box = _spec_box(state)
        if box is not None:
            act = space_codec(box, role="action", schema=act_schema, key=act.single_field)
    bounded = _legal_bounded_field(act, act_schema) if legal is not None else None
    if bounded is not None:
        needs_first = True
        n = _legal_count(first.get(LEGAL_ACTIONS)) if first is not None else None
        if n is not None:  # Discrete(n) over that field; the action's other (optional) fields: the server's defaults
            codec = FieldCodec(kind="discrete", path=bounded, role="action", dtype=np.dtype(np.int64), low=0, high=n - 1)
            act = SchemaSpace(gym.spaces.Discrete(n), (bounded,), bounded, codec, "action")
    return act, needs_first, needs_state


#: Most values of an action a dm_env-style ``action_spec`` may give (more: no space is made of it).
_MAX_SPEC_VALUES = 4096


def _spec_box(state: Mapping[str, Any] | None) -> gym.spaces.Box | None:
    """The float64 ``Box`` a dm_env-style ``state["action_spec"]`` describes (``shape`` of one dimension, ``minimum``, ``maximum``), or ``None``."""
    spec = state.get("action_spec") if isinstance(state, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    shape = spec.get("shape")
    if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int and 0 < shape[0] <= _MAX_SPEC_VALUES):
        return None
    n = shape[0]
    bounds = []
    for key in ("minimum", "maximum"):
        value = spec.get(key)
        values = value if isinstance(value, list) else [value] * n
        if len(values) != n or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            return None
        bounds.append(np.array(values, dtype=np.float64))
    low, high = bounds
    if not (low <= high).all():
        return None
    return gym.spaces.Box(low, high, (n,), np.float64)


def _observation_names(props: Mapping[str, Any], truncated_key: str | None, flags: tuple[str, ...]) -> list[str]:
    """The observation fields that an observation space may cover (not ``done``/``reward``/``metadata`` or a flag)."""
    return [str(k) for k in props if k not in OBSERVATION_BASE_FIELDS and k != truncated_key and k not in flags]


def _legal_bounded_field(act: SchemaSpace, act_schema: Any) -> str | None:
    """The action field that ``legal_actions`` bounds: the one required field, an integer with no range; or ``None``."""
    if not isinstance(act_schema, Mapping):
        return None
    required = act_schema.get("required")
    required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    if len(required) != 1 or required[0] not in act.fields:
        return None
    name = required[0]
    space = act.space if act.single_field == name else act.space[name] if isinstance(act.space, gym.spaces.Dict) else None
    return name if isinstance(space, UnboundedInteger) else None


def _legal_count(legal: Any) -> int | None:
    """``1 +`` the largest of a first observation's legal actions (a list of integers >= 0); ``None`` if there is none."""
    if isinstance(legal, (list, tuple)) and legal and all(type(a) is int and 0 <= a < 2**31 for a in legal):
        return max(legal) + 1
    return None


def _extension_name(extension: Mapping[str, Any], key: str) -> str | None:
    """A field name the server's :data:`SCHEMA_EXTENSION` block gives, or ``None``."""
    name = extension.get(key)
    if name is None or isinstance(name, str):
        return name
    raise SpaceMappingError(f"the server's /schema is malformed: {SCHEMA_EXTENSION}.{key} must be a string, got {name!r:.40}")


def _is_boolean_field(schema: Mapping[str, Any], name: str) -> bool:
    """Whether ``name`` is a ``bool`` or ``Optional[bool]`` property of ``schema``."""
    prop = schema.get("properties", {}).get(name) if isinstance(schema.get("properties"), dict) else None
    if not isinstance(prop, dict):
        return False
    t = prop.get("type")
    if t == "boolean" or (isinstance(t, list) and set(t) in ({"boolean"}, {"boolean", "null"})):
        return True
    union = prop.get("anyOf", prop.get("oneOf"))
    if t is None and isinstance(union, list) and union:
        kinds = {o.get("type") if isinstance(o, dict) else None for o in union}
        return "boolean" in kinds and kinds <= {"boolean", "null"}
    return False
