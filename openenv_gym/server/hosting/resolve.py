"""From a command-line env id to a :class:`~openenv_gym.server.hosting.hosts.HostFactory`.

- ``CartPole-v1``: a registered Gymnasium id.
- ``module:EnvId``: import ``module`` (which registers ``EnvId`` with
  Gymnasium), then make ``EnvId``, as ``gymnasium.make`` does.
- ``module:ClassName`` where ``ClassName`` is an OpenEnv ``Environment``
  subclass: host it with its Action and Observation classes.
- ``module:name`` where ``name`` is not an id ``gymnasium.make`` makes (with
  or without its version) but a ``gymnasium.Env`` subclass or a function
  returning a ``gymnasium.Env``: host what calling it (with the env kwargs)
  returns.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from typing import Any, Mapping, TypeGuard

from .gym_host import GymHostFactory
from .hosts import HostFactory

__all__ = ["resolve_factory", "load_object"]


def load_object(spec: str) -> Any:
    """The object named by ``"package.module:Name"``.

    Raises:
        ValueError: ``spec`` is not of that form, or the module has no such name.
        ImportError: the module cannot be imported.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'module:Name', got {spec!r}")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attr!r}") from None
    return obj


def _is_openenv_environment(obj: Any) -> TypeGuard[type]:
    interfaces = sys.modules.get("openenv.core.env_server.interfaces")
    if interfaces is None or not inspect.isclass(obj):
        return False
    return issubclass(obj, interfaces.Environment)


def _registered(name: str) -> bool:
    """Whether ``gymnasium.make`` makes ``name`` (a versionless name is its latest version, ``Walker`` ``Walker-v0``)."""
    import gymnasium
    from gymnasium.envs.registration import find_highest_version, parse_env_id

    if name in gymnasium.registry:
        return True
    try:
        namespace, base, version = parse_env_id(name)
    except gymnasium.error.Error:
        return False
    return version is None and find_highest_version(namespace, base) is not None


def resolve_factory(
    env_id: str,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    action_class: str | None = None,
    observation_class: str | None = None,
    state_class: str | None = None,
    max_sessions: int = 1,
) -> HostFactory:
    """The host factory for ``env_id`` (see the module docstring).

    Args:
        env_id: ``EnvId``, ``module:EnvId``, ``module:EnvironmentClass``, or
            ``module:name`` of a ``gymnasium.Env`` subclass or factory.
        env_kwargs: keyword arguments for ``gymnasium.make``, the Environment
            class or the factory.
        action_class, observation_class, state_class: ``module:Name`` of the
            OpenEnv model classes, when they cannot be read from the
            Environment's generic parameters.
        max_sessions: the server's session limit (checked against
            ``SUPPORTS_CONCURRENT_SESSIONS`` for OpenEnv envs).

    Raises:
        ValueError, ImportError: the id cannot be resolved.
    """
    if ":" in env_id:
        module_name, _, attr = env_id.partition(":")
        module = importlib.import_module(module_name)
        obj = getattr(module, attr, None)
        if _is_openenv_environment(obj):
            from .openenv_host import OpenEnvHostFactory

            factory = functools.partial(obj, **env_kwargs) if env_kwargs else obj
            return OpenEnvHostFactory(
                factory,
                load_object(action_class) if action_class else None,
                load_object(observation_class) if observation_class else None,
                state_cls=load_object(state_class) if state_class else None,
                name=obj.__name__,
                max_sessions=max_sessions,
            )
        if callable(obj) and not _registered(attr):
            if action_class or observation_class or state_class:
                raise ValueError("--action-class, --observation-class and --state-class only apply to OpenEnv Environment classes")
            make = functools.partial(obj, **env_kwargs) if env_kwargs else obj
            return GymHostFactory(make, name=getattr(obj, "__name__", attr))
    if action_class or observation_class or state_class:
        raise ValueError("--action-class, --observation-class and --state-class only apply to OpenEnv Environment classes")
    return GymHostFactory(env_id, env_kwargs)
