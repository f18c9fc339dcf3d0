"""``python -m openenv_gym.server serve ENV_ID ...``: the same as ``openenv-gym serve``."""

import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main())
