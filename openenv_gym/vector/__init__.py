"""The vector pool: :class:`OpenEnvVectorEnv` over many remote sessions."""

from .env import OpenEnvVectorEnv

__all__ = ["OpenEnvVectorEnv"]
