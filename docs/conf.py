"""Sphinx configuration of the openenv_gym docs (``python -m sphinx -W -b html docs docs/_build``).

Sphinx, as Gymnasium and websockets use, because its ``autodoc`` reads the
package's docstrings as they are written (reST roles, Google-style sections),
``-W`` turns a broken reference into a failed build, and MyST lets the pages
stay Markdown (``docs/PROTOCOL.md`` among them).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import openenv_gym  # noqa: E402

project = "openenv_gym"
author = "openenv_gym contributors"
copyright = "openenv_gym contributors, BSD-3-Clause"
version = release = openenv_gym.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinxarg.ext",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
# (no network while the docs build: references to other projects' objects stay plain text)
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Every reference resolves (-n): a broken one to this package's API fails the build. Those to other
# projects' objects (numpy, gymnasium, the standard library: no inventory without network) and to the
# private modules behind the API are let through.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|gym|gymnasium|collections|ssl|ssl_module|os|multiprocessing|asyncio|stable_baselines3|torch)\..*"),
    (r"py:.*", r"openenv_gym\.(protocol|client|vector|server|spaces|remote|env|config|errors)\..*"),
    (r"py:.*", r"(AutoresetMode|VectorEnv|OpenSocket|StockConnection|FastConnection|TEXT_CHARSET|TEXT_SAMPLE_MAX_LENGTH|feature_space)"),
]
# (MyST asks every domain about a link; sphinx-argparse's cannot answer, and says so for each)
suppress_warnings = ["myst.domains"]

html_theme = "furo"
html_title = f"openenv_gym {release}"
html_static_path: list[str] = []
