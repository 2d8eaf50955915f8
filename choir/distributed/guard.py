"""Roles on the wire: which certificate may ask a Dask scheduler, worker or nanny for what.

Mutual TLS lets in any certificate of the cluster's CA, and Dask itself does not look at who
asks: a worker's certificate (its key read by code that broke out of a step on that worker)
could register as a client and submit tasks, or call another worker's ``run`` directly, and
so make every worker seal forged results, which would defeat independent reruns. This
module is a Dask preload (``--preload choir.distributed.guard`` on the scheduler and the
workers, ``--preload-nanny`` on the nannies): it wraps the operations below so that each
answers only peers whose certificate has one of the listed roles (the subject's OU, see
``choir.distributed.pki``), and a worker registers only under its certificate's name (CN).
A refused call raises ``PermissionError`` to the caller.

Other operations (information: who has what, versions, logs) stay open to any certificate
of the CA. Data a worker fetches from a peer is still unpickled; Choir's tasks depend only
on the snapshot, broadcast by the scheduler, so no worker fetches from another.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

_CLIENT = frozenset({"client"})
_WORKER = frozenset({"worker"})
_SCHEDULER = frozenset({"scheduler"})

# operation -> roles allowed to call it; anything that runs code, moves data or changes
# the cluster belongs to the role that does it
SCHEDULER_RULES: dict[str, frozenset[str]] = {
    "register-client": _CLIENT,  # the stream every task submission travels on
    "register-worker": _WORKER, "register_nanny": _WORKER, "heartbeat_worker": _WORKER,
    **{op: _CLIENT for op in (
        "scatter", "gather", "feed", "broadcast", "proxy", "run_function", "restart",
        "restart_workers", "retire_workers", "rebalance", "replicate", "update_data",
        "set_resources", "set_restrictions", "set_metadata", "retry", "terminate",
        "register_scheduler_plugin", "unregister_scheduler_plugin", "register_worker_plugin",
        "unregister_worker_plugin", "register_nanny_plugin", "unregister_nanny_plugin",
        "dump_cluster_state_to_url", "start_task_metadata", "stop_task_metadata",
        "subscribe_worker_status")},
}
WORKER_RULES: dict[str, frozenset[str]] = {op: _SCHEDULER for op in (
    "gather", "run", "run_coroutine", "update_data", "free_keys", "terminate", "upload_file",
    "actor_execute", "actor_attribute", "plugin-add", "plugin-remove", "benchmark_disk",
    "benchmark_memory", "benchmark_network")}
NANNY_RULES: dict[str, frozenset[str]] = {
    **{op: _SCHEDULER for op in ("instantiate", "run", "plugin_add", "plugin_remove")},
    **{op: _SCHEDULER | _WORKER for op in ("kill", "restart", "terminate",
                                           "close_gracefully")},
}


def _subject(comm: Any, field: str) -> str | None:
    """One field of the subject of the certificate the peer of ``comm`` showed (TLS only)."""
    cert = (getattr(comm, "extra_info", None) or {}).get("peercert") or {}
    values = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == field]
    return values[0] if len(values) == 1 else None


def peer_role(comm: Any) -> str | None:
    """The role (OU) in the certificate the peer of ``comm`` showed; None without TLS."""
    return _subject(comm, "organizationalUnitName")


def _guarded(op: str, handler: Callable[..., Any], roles: frozenset[str],
             server: str) -> Callable[..., Any]:
    signature = inspect.signature(handler)
    params = list(signature.parameters.values())
    takes_comm = bool(params) and params[0].name == "comm"

    async def guarded(comm: Any, **msg: Any) -> Any:
        role = peer_role(comm)
        if role not in roles:
            raise PermissionError(f"the {server} refused {op!r} to a {role or 'non-TLS'} peer "
                                  f"(allowed: {', '.join(sorted(roles))})")
        if op == "register-worker" and str(msg.get("name")) != _subject(comm, "commonName"):
            # a worker is known by its certificate's name: no worker joins as another
            raise PermissionError(f"the {server} refused worker name {msg.get('name')!r} to "
                                  f"the certificate of {_subject(comm, 'commonName')!r}")
        result = handler(comm, **msg) if takes_comm else handler(**msg)
        return await result if inspect.isawaitable(result) else result

    # Dask inspects a handler's parameters (a first ``comm``, ``serializers``): the
    # original's, with ``comm`` first
    comm = inspect.Parameter("comm", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    guarded.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=params if takes_comm else [comm, *params])
    guarded.__name__ = getattr(handler, "__name__", op)
    return guarded


def guard(server: Any) -> None:
    """Wrap ``server``'s operations by its kind's rules (idempotent per server)."""
    kind = type(server).__name__.lower()
    rules = {"scheduler": SCHEDULER_RULES, "worker": WORKER_RULES,
             "nanny": NANNY_RULES}.get(kind)
    if rules is None:
        raise RuntimeError(f"choir.distributed.guard does not know a Dask {kind}")
    if getattr(server, "_choir_guarded", False):
        return
    for op, roles in rules.items():
        if op in server.handlers:
            server.handlers[op] = _guarded(op, server.handlers[op], roles, kind)
    server._choir_guarded = True


def dask_setup(server: Any) -> None:
    """Dask's preload hook."""
    guard(server)
