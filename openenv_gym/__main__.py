"""``python -m openenv_gym ...``: the same as the ``openenv-gym`` command (``serve``, ``check``, ``bench``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
