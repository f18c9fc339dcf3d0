"""Runnable examples of openenv_gym; each module's docstring says how to run it.

A package so that server processes can import the example environment
(``examples.guess_number_env``) when started from the repository root.
"""
