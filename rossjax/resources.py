"""Files rossjax ships: the default configs (package data, so they are found from any working
directory and from an installed wheel). No jax."""

from __future__ import annotations

import importlib.resources
import os


def config_path(name: str) -> str:
    """Absolute path of the shipped default config `name` (e.g. "curate.py"): the
    `rossjax/configs` package data (a link to the checkout's configs/ that the wheel copies in),
    else the checkout's configs/ folder."""
    shipped = importlib.resources.files("rossjax") / "configs" / name
    if shipped.is_file():
        # The real path: configs find data/ relative to their own file, which the link would hide.
        return os.path.realpath(str(shipped))
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(here, "configs", name)
