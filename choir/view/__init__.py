"""``choir view``: a local, read-only web viewer over what Choir stored.

Runs, verify sessions, a run's timeline, reports with their cited log lines, attestations
with their signature status re-derived on every view, the AHDB's atoms and ``choir audit``'s
violations, each page rendered on the server from Choir's own store APIs. Nothing here
writes to ``CHOIR_HOME`` or holds the signing key: the viewer reads bytes that verified code
wrote, so it is kept apart from the key like every other reader of hostile bytes.

The web stack (Starlette, uvicorn, Jinja2) is the ``view`` extra and is imported only when the
viewer starts, so ``import choir`` and ``choir --help`` never pay for it.
"""

from __future__ import annotations

import importlib.util

from choir.exceptions import UserError

EXTRA_MODULES = ("starlette", "uvicorn", "jinja2")
INSTALL_HINT = "pip install 'choir[view]'"


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def require_extra() -> None:
    """Fail with the exact install command when the ``view`` extra is missing.

    Raises:
        UserError: starlette, uvicorn or jinja2 is not installed.
    """
    missing = [m for m in EXTRA_MODULES if _absent(m)]
    if missing:
        raise UserError(f"choir view needs {', '.join(missing)}, which is not installed\n"
                        f"  fix: {INSTALL_HINT}")


__all__ = ["EXTRA_MODULES", "INSTALL_HINT", "require_extra"]
