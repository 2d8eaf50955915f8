"""The one loader for packaged data: ``policies/`` and ``prompts/``.

In a wheel they live in ``choir/_data/``; in a source checkout, at the repo's top level.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

Kind = Literal["policies", "prompts"]


def data_path(kind: Kind) -> Traversable:
    packaged = files("choir") / "_data" / kind
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / kind  # the repo checkout: choir/_core/ -> ./


def load_text(kind: Kind, name: str) -> str:
    return (data_path(kind) / name).read_text(encoding="utf-8")
