"""A stock OpenEnv app laid out as OpenEnv's envs ship (``server/app.py``), imported as ``server.app:app`` from its folder.

As shipped, it allows one session a server (``create_app``'s default), unless
``MAX_CONCURRENT_ENVS`` says more, as several of OpenEnv's apps read it.
"""

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from tests.servers.shaped_envs import (
    BlindControlEnvironment,
    ControlAction,
    ControlEnvironment,
    ControlObservation,
    GridAction,
    GridEnvironment,
    GridObservation,
    TokensAction,
    TokensEnvironment,
    TokensObservation,
    TurnAction,
    TurnEnvironment,
    TurnObservation,
)
from tests.servers.stock_envs import CalcEnvironment

_limit = int(os.environ.get("MAX_CONCURRENT_ENVS", "1"))

app = create_app(GridEnvironment, GridAction, GridObservation, env_name="grid", max_concurrent_envs=_limit)
tokens_app = create_app(TokensEnvironment, TokensAction, TokensObservation, env_name="tokens", max_concurrent_envs=_limit)
control_app = create_app(ControlEnvironment, ControlAction, ControlObservation, env_name="control", max_concurrent_envs=_limit)
turn_app = create_app(TurnEnvironment, TurnAction, TurnObservation, env_name="turn", max_concurrent_envs=_limit)
mcp_app = create_app(CalcEnvironment, CallToolAction, CallToolObservation, env_name="mcp", max_concurrent_envs=_limit)
blind_control_app = create_app(BlindControlEnvironment, ControlAction, ControlObservation, env_name="blind", max_concurrent_envs=_limit)
