"""Every error Choir raises: the public names of :mod:`choir._core.errors`.

They are defined in the foundation layer so that the layers below everything else (the
registry every pluggable kind uses) can raise them; users import them from here, and they
print, pickle and compare as ``choir.exceptions.<Name>``.
"""

from __future__ import annotations

from choir._core import errors
from choir._core.errors import *  # noqa: F403

__all__ = errors.__all__

for _name in __all__:
    globals()[_name].__module__ = __name__
