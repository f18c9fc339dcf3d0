"""What the server hosts: the envs behind the sessions, and how their calls run. No sockets.

:mod:`.hosts` is the interface the connection loops call; :mod:`.gym_host`
and :mod:`.openenv_host` implement it; :mod:`.resolve` finds one from a
command-line env id; :mod:`.runner` runs the calls inline or in threads;
:mod:`.sessions` counts them; :mod:`.values` and :mod:`.schema` turn wire
values into env values and spaces into ``/schema``, and back.
"""
