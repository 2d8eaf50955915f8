"""Sandboxes by name: ``docker``, ``bwrap``, ``local`` (unsafe) and ``auto``."""

from choir.sandbox.base import (
    ExecResult,
    Sandbox,
    get_sandbox,
    register_sandbox,
    resolve_sandbox,
    sandbox_names,
)

__all__ = [
    "ExecResult",
    "Sandbox",
    "get_sandbox",
    "register_sandbox",
    "resolve_sandbox",
    "sandbox_names",
]
