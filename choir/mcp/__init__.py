"""``choir mcp``: Choir's verification as tools an agent calls over the Model Context Protocol.

An agent (a coding CLI, an IDE agent) asks Choir to verify the tree it edits, reads the
bounded reports, failure signatures and attestation ids, asks the gate, and lists runs. It
gets exactly what the executor of ``choir run`` gets: bounded reports, held-out checks as
counts only, never a raw log. Every argument is validated against a closed model, so no
call names a repo the person did not serve, a mood the policy does not know, a sandbox, a
network, a command or a home: those are fixed when the person starts the server.

The server reads bytes that verified code wrote (reports, summaries), so it runs confined like
``choir verify``: the key is reachable only through the signing broker (``choir.trusted``).

The SDK (the ``mcp`` extra) is imported only when the server starts. This package is
``choir.mcp``; inside it, ``import mcp`` is the SDK (imports are absolute).
"""

from __future__ import annotations

import importlib.util

from choir.exceptions import UserError

INSTALL_HINT = "pip install 'choir[mcp]'"


def require_extra() -> None:
    """Fail with the exact install command when the ``mcp`` SDK is missing.

    Raises:
        UserError: the ``mcp`` package is not installed.
    """
    try:
        found = importlib.util.find_spec("mcp") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UserError(f"choir mcp needs the mcp SDK, which is not installed\n"
                        f"  fix: {INSTALL_HINT}")


__all__ = ["INSTALL_HINT", "require_extra"]
