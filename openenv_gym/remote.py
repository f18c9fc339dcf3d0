"""What the client learns about a remote environment before it opens a session.

:func:`fetch_schema` reads ``/schema`` (and :func:`fetch_health` reads ``/health``);
:func:`resolve_spaces` turns the schema and the user's overrides into the
observation and action codecs that both :class:`~openenv_gym.OpenEnvEnv` and
:class:`~openenv_gym.OpenEnvVectorEnv` use.
"""

from __future__ import annotations

import json
import ssl as ssl_module
from dataclasses import dataclass, replace
from typing import Any, Mapping

import gymnasium as gym
import httpx

from ._urls import http_url, is_loopback, socket_of, unix_path
from .config import Limits
from .errors import ConnectError, refused_because
from .spaces import (
    SchemaSpace,
    SpaceMappingError,
    action_space_from_schema,
    observation_space_from_schema,
    space_codec,
    space_from_description,
)

__all__ = ["SCHEMA_EXTENSION", "fetch_schema", "fetch_health", "RemoteSpaces", "resolve_spaces"]

#: Key of the ``/schema`` block in which openenv_gym servers describe exact Gymnasium spaces.
SCHEMA_EXTENSION = "x-openenv-gym"


#: Largest ``/schema`` or ``/health`` answer read, in bytes, unless told otherwise (``Limits().max_frame_bytes``).
MAX_BODY_BYTES = Limits().max_frame_bytes


def _get_json(
    base_url: str,
    endpoint: str,
    headers: Mapping[str, str] | None,
    timeout: float,
    ssl: ssl_module.SSLContext | None,
    max_bytes: int = MAX_BODY_BYTES,
) -> Any:
    """GET ``endpoint`` and decode its JSON body, read up to ``max_bytes`` (``ConnectError`` beyond)."""
    try:
        socket_path, _ = socket_of(base_url, tls=ssl is not None)
        url = http_url(base_url, endpoint)
    except ValueError as exc:
        raise ConnectError(f"GET {endpoint} of {base_url}: {exc}", url=base_url) from None
    shown = _shown(base_url, endpoint)
    url_arg = url if socket_path is None else base_url  # what the error names as its url
    verify = ssl if ssl is not None else True
    try:
        with httpx.Client(
            # (identity: what is counted against max_bytes is what was sent)
            headers={"Accept-Encoding": "identity", **dict(headers or {})},
            timeout=timeout,
            verify=verify,
            trust_env=not is_loopback(base_url),
            transport=httpx.HTTPTransport(uds=socket_path, verify=verify) if socket_path is not None else None,
        ) as client, client.stream("GET", url) as response:
            response.raise_for_status()
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ConnectError(f"GET {shown}: the answer is over {max_bytes} bytes (Limits.max_frame_bytes)", url=url_arg)
        return json.loads(body)
    except httpx.HTTPStatusError as exc:
        status = exc.response.status_code
        raise ConnectError(f"GET {shown} answered HTTP {status}{refused_because(status)}", url=url_arg) from None
    except (httpx.HTTPError, ValueError) as exc:
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
) -> dict[str, Any]:
    """GET ``/schema`` from the server at ``base_url`` (``timeout`` in seconds, an answer of at most ``max_bytes``).

    Returns the JSON object with the ``action``, ``observation`` and ``state``
    JSON Schemas and, from openenv_gym servers, the :data:`SCHEMA_EXTENSION` block.

    Raises:
        ConnectError: no answer in time, an HTTP error, an answer over
            ``max_bytes`` or nested too deep, or not an OpenEnv schema.
    """
    schema = _get_json(base_url, "/schema", headers, timeout, ssl, max_bytes)
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
) -> dict[str, Any]:
    """GET ``/health`` (``timeout`` in seconds, an answer of at most ``max_bytes``).

    Stock servers answer ``{"status": "healthy"}``; openenv_gym servers add
    ``active_sessions`` and ``max_sessions``.
    """
    health = _get_json(base_url, "/health", headers, timeout, ssl, max_bytes)
    if not isinstance(health, dict):
        raise ConnectError(f"{_shown(base_url, '/health')} did not return an object", url=base_url)
    return health


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
    """

    observation: SchemaSpace
    action: SchemaSpace
    truncated_key: str | None
    terminated_key: str | None = None
    max_episode_steps: int | None = None


def resolve_spaces(
    schema: Mapping[str, Any],
    *,
    observation_space: gym.Space | None = None,
    action_space: gym.Space | None = None,
    obs_key: str | None = None,
    action_key: str | None = None,
    truncated_key: str | None = None,
    variable_fields: tuple[str, ...] = (),
) -> RemoteSpaces:
    """Build the codecs from a ``/schema`` response; explicit spaces and keys win.

    From an openenv_gym server the exact spaces and field names come from the
    :data:`SCHEMA_EXTENSION` block; otherwise they are mapped from the JSON Schemas.
    Without ``truncated_key``, a boolean observation field named ``truncated``
    is taken as the truncation flag; with it and a field named ``observation``,
    one named ``terminated`` is taken as the termination flag (the shape of a
    Gymnasium env served over OpenEnv).

    Raises:
        SpaceMappingError: a field cannot be mapped; the message names the field
            and the argument that fixes it.
    """
    extension = schema.get(SCHEMA_EXTENSION)
    terminated_key = None
    max_episode_steps = None
    if isinstance(extension, dict):
        limit = extension.get("max_episode_steps")
        max_episode_steps = limit if type(limit) is int and limit > 0 else None
        obs_key = obs_key or _extension_name(extension, "obs_key")
        action_key = action_key or _extension_name(extension, "action_key")
        truncated_key = truncated_key or _extension_name(extension, "truncated_key")
        terminated_key = _extension_name(extension, "terminated_key")
        if observation_space is None and "observation_space" in extension:
            observation_space = space_from_description(extension["observation_space"])
        if action_space is None and "action_space" in extension:
            action_space = space_from_description(extension["action_space"])
    obs_schema = schema["observation"]
    if truncated_key is None and _is_boolean_field(obs_schema, "truncated"):
        # A boolean observation field called "truncated" says what its name says.
        truncated_key = "truncated"
    if (
        terminated_key is None
        and truncated_key == "truncated"
        and _is_boolean_field(obs_schema, "terminated")
        and "observation" in obs_schema.get("properties", {})
    ):
        # The shape of a Gymnasium env served over OpenEnv (fields observation, truncated, terminated):
        # its "terminated" is Gymnasium's. In other envs such a field is theirs, and stays in the observation.
        terminated_key = "terminated"
    if not (isinstance(terminated_key, str) and terminated_key != truncated_key and terminated_key != obs_key):
        terminated_key = None
    flags = (terminated_key,) if terminated_key is not None else ()
    if observation_space is not None:
        if variable_fields:
            raise ValueError("variable_fields= shapes spaces built from the schema; an explicit observation_space= has its own")
        obs = space_codec(
            observation_space, role="observation", schema=obs_schema, key=obs_key, truncated_key=truncated_key, exclude=flags
        )
    else:
        obs = observation_space_from_schema(
            obs_schema, obs_key=obs_key, truncated_key=truncated_key, exclude=flags, variable=variable_fields
        )
    reset_schema = schema.get("reset_observation")
    if isinstance(reset_schema, dict) and reset_schema != obs_schema:
        # OpenEnv's reset_observation model: fields of the step model it lacks read as null on reset.
        step_fields = obs_schema.get("properties")
        reset_fields = reset_schema.get("properties")
        step_fields = step_fields if isinstance(step_fields, dict) else {}
        reset_fields = reset_fields if isinstance(reset_fields, dict) else {}
        obs = obs.allow_missing(set(step_fields) - set(reset_fields))
        # And the fields only it has (an intro, the task's prompt): in a reset's info, as received.
        reset_only = sorted(set(reset_fields) - set(step_fields) - {"done", "reward", "metadata"} - set(obs.info_fields))
        if reset_only:
            obs = replace(obs, info_fields=obs.info_fields + tuple(reset_only))
    act_schema = schema.get("action")
    if action_space is not None:
        act = space_codec(action_space, role="action", schema=act_schema, key=action_key)
    else:
        act = action_space_from_schema(act_schema or {}, action_key=action_key)
    return RemoteSpaces(obs, act, truncated_key, terminated_key, max_episode_steps)


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
