"""Roles on the wire: which certificate may ask a Dask scheduler, worker or nanny for what,
and send it what.

Mutual TLS lets in any certificate of the cluster's CA, and Dask itself does not look at who
asks: a worker's certificate (its key read by code that broke out of a step on that worker)
could register as a client and submit tasks, or call another worker's ``run`` directly, and
so make every worker seal forged results, which would defeat independent reruns. This
module is a Dask preload (``--preload choir.distributed.guard`` on the scheduler and the
workers, ``--preload-nanny`` on the nannies). Each kind of server is driven by one role (a
scheduler by clients, a worker and a nanny by the scheduler): a peer of that role may ask
for anything; any other peer only for the operations listed for its role below, and a
worker registers only under its certificate's name (CN). The role is the subject's OU of
the certificate the peer showed (``choir.distributed.pki``). A refused call raises
``PermissionError`` to the caller.

Checking operations is not enough (review 23c): Dask unpickles every ``ToPickle`` value of a
message while it reads it, before any handler runs, and loads the pickled exceptions of an
error reply after. So:

- a pickle is loaded whole only from the role that drives this process (``DRIVER``); from
  any other peer it may build plain values only (bytes, strings, numbers, containers: what
  a worker fetches from another), and the read that meets anything else (a global, a
  reduce of one) drops the connection, nothing run;
- an error a peer sends is never unpickled here (its text is kept);
- on the scheduler, a worker's stream carries only the messages workers send, each about
  that worker, and a client's stream only a client's.

Importing this module arms the wire checks in the whole process (it is meant to be imported
by Dask as a preload, before the server listens); until ``guard`` has named the process's
server, every connection to it is dropped and no pickle is loaded.
"""

from __future__ import annotations

import contextvars
import enum
import inspect
import io
import pickle
import sys
from collections.abc import Callable, Mapping
from typing import Any

from choir.distributed.pki import peer_role, peer_subject
from choir.distributed.wire import around_reads

_CLIENT = frozenset({"client"})
_WORKER = frozenset({"worker"})
_SCHEDULER = frozenset({"scheduler"})

# the role that drives each kind of server: it may ask for any operation, and only its
# messages may carry pickles (a task's code, the scheduler's run specs)
DRIVER: dict[str, frozenset[str]] = {"scheduler": _CLIENT, "worker": _SCHEDULER,
                                     "nanny": _SCHEDULER}
# operation -> the roles allowed to call it, where that is not the driver alone
SCHEDULER_RULES: dict[str, frozenset[str]] = {
    "register-worker": _WORKER,  # a worker's stream; never a client's
    "register_nanny": _WORKER, "heartbeat_worker": _WORKER, "unregister": _WORKER,
    "who_has": _CLIENT | _WORKER,
}
WORKER_RULES: dict[str, frozenset[str]] = {
    "get_data": _SCHEDULER | _CLIENT | _WORKER,  # results are signed; their bytes are public
}
NANNY_RULES: dict[str, frozenset[str]] = {
    op: _SCHEDULER | _WORKER for op in ("kill", "restart", "terminate", "close_gracefully")}
_RULES = {"scheduler": SCHEDULER_RULES, "worker": WORKER_RULES, "nanny": NANNY_RULES}
# what a worker sends on its stream to the scheduler; everything else there is a client's
WORKER_STREAM_OPS = frozenset({
    "task-finished", "task-erred", "release-worker-data", "add-keys", "long-running",
    "reschedule", "keep-alive", "log-event", "worker-status-change",
    "request-refresh-who-has"})

# the role of the peer whose connection this task serves (set by ``_handle_comm``)
_PEER: contextvars.ContextVar[str | None] = contextvars.ContextVar("choir_dask_peer")
# the peer a read in progress loads plain pickles only from (None: any pickle)
_REFUSING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "choir_dask_refusing", default=None)
# the ``extra`` of the stream being handled (``{"worker": address}`` or ``{"client": id}``)
_STREAM: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("choir_stream")
_pickles_from: frozenset[str] = frozenset()  # this process's driver, once ``guard`` ran


class PickleRefused(PermissionError):
    """A peer that does not drive this process sent a pickle of more than plain data."""


# what a pickle from a peer that does not drive this process may build: plain values (the
# snapshot's bytes a worker fetches from another, and their type in Dask's header)
PLAIN_TYPES = frozenset({"bytes", "bytearray", "memoryview", "str", "int", "float", "complex",
                         "bool", "tuple", "list", "dict", "set", "frozenset"})


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain values only: every global a pickle names goes through ``find_class``
    (Python's documented way to restrict unpickling), and only ``PLAIN_TYPES`` pass."""

    def __init__(self, file: io.BytesIO, peer: str, buffers: Any = ()) -> None:
        super().__init__(file, buffers=buffers or None)
        self.peer = peer

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in PLAIN_TYPES:
            return super().find_class(module, name)
        raise PickleRefused(f"a {self.peer} peer sent a pickle of {module}.{name}; only "
                            f"{', '.join(sorted(_pickles_from)) or 'no peer'} may send "
                            "more than plain data here")


def _role_name(role: str | None) -> str:
    return role or "non-TLS"


def _arm() -> None:
    """Patch Dask's read path, unpickler, error loader and connection handler (once)."""
    from distributed import core
    from distributed.protocol import core as protocol_core
    from distributed.protocol import pickle as dask_pickle

    if getattr(dask_pickle.loads, "_choir", False):
        return
    plain_loads: Any = dask_pickle.loads
    plain_clean: Any = core.clean_exception
    plain_handle: Any = core.Server._handle_comm
    plain_decode: Any = getattr(protocol_core, "msgpack_decode_default")  # noqa: B009

    def refusing(comm: Any) -> str | None:
        role = peer_role(comm)
        return None if role in _pickles_from else _role_name(role)

    def loads(x: Any, *, buffers: Any = ()) -> Any:
        peer = _REFUSING.get()
        if peer is None:
            return plain_loads(x, buffers=buffers)
        return _PlainUnpickler(io.BytesIO(x), peer, buffers=buffers).load()

    def clean_exception(exception: Any = None, traceback: Any = None, **kwargs: Any) -> Any:
        # an error reply's pickled exception and traceback: its text only
        if isinstance(exception, (bytes, bytearray)):
            exception = str(kwargs.get("exception_text") or "a peer's error (not loaded)")
        if isinstance(traceback, (bytes, bytearray)):
            traceback = None
        return plain_clean(exception, traceback, **kwargs)

    async def handle_comm(self: Any, comm: Any) -> None:
        if not getattr(self, "_choir_guarded", False):
            comm.abort()  # a connection before the guard took this server: none is served
            return
        _PEER.set(peer_role(comm))  # this connection's task only
        await plain_handle(self, comm)

    def decode(obj: Any) -> Any:
        # ``__Enum__`` names a module and two attributes, resolved while the message is
        # read: from a peer that does not drive this process, an enum's member only (any
        # other attribute of a dask or distributed module, ``os.system`` through
        # ``distributed.utils`` included, is no value a peer sends)
        value = plain_decode(obj)
        peer = _REFUSING.get()
        if peer is not None and "__Enum__" in obj and not isinstance(value, enum.Enum):
            raise PickleRefused(f"a {peer} peer named {obj.get('__module__')!r}."
                                f"{obj.get('__name__')!r}.{obj.get('name')!r}, not an enum")
        return value

    loads._choir = True  # type: ignore[attr-defined]
    around_reads(_REFUSING, refusing, PickleRefused)
    dask_pickle.loads = loads
    setattr(protocol_core, "msgpack_decode_default", decode)  # noqa: B010
    core.clean_exception = clean_exception
    scheduler_module = sys.modules.get("distributed.scheduler")
    if scheduler_module is not None:  # it imported the name (its ``uncaught-error`` handler)
        scheduler_module.clean_exception = clean_exception  # type: ignore[attr-defined]
    core.Server._handle_comm = handle_comm  # type: ignore[method-assign]


class _Handlers(dict):  # type: ignore[type-arg]
    """A server's operations, each answering only the roles allowed to call it (looked up
    by Dask for every request, plugins' operations added later included)."""

    def __init__(self, handlers: Mapping[str, Any], server: Any, kind: str) -> None:
        super().__init__(handlers)
        self.server, self.kind = server, kind

    def __getitem__(self, op: str) -> Any:
        handler = super().__getitem__(op)
        try:
            role = _PEER.get()
        except LookupError:  # not a request from the wire: the server's own lookup
            return handler
        roles = _RULES[self.kind].get(op, DRIVER[self.kind])
        if role in roles:
            if role == "worker" and (self.kind, op) in _OWN:
                return _own(op, handler, self.server, self.kind)
            return handler
        message = (f"the {self.kind} refused {op!r} to a {_role_name(role)} peer (allowed: "
                   f"{', '.join(sorted(roles))})")

        def refused(**_: Any) -> None:
            raise PermissionError(message)

        return refused


# what a worker certificate may do only for its own worker: at the scheduler, register
# (under its name), heartbeat or unregister (by address); at a nanny, stop the worker it
# runs (review 24a: one worker took the others out, and freed its name for an impostor)
_OWN = frozenset({("scheduler", "register-worker"), ("scheduler", "unregister"),
                  ("scheduler", "heartbeat_worker"), *(("nanny", op) for op in NANNY_RULES)})


def _own(op: str, handler: Callable[..., Any], server: Any, kind: str) -> Callable[..., Any]:
    """``handler`` for a worker peer, answering only about the worker its certificate names
    (its CN): the name it registers under, the worker at the address it names (read as
    Dask will), or the nanny's own worker."""
    takes_comm = next(iter(inspect.signature(handler).parameters), None) == "comm"

    async def own(comm: Any, **msg: Any) -> Any:
        name = str(peer_subject(comm, "commonName"))
        if kind == "nanny":
            whose = str(server.name)
        elif op == "register-worker":
            if str(msg.get("name")) != name:  # no worker joins as another
                raise PermissionError(f"the {kind} refused worker name {msg.get('name')!r} "
                                      f"to the certificate of {name!r}")
            whose = name
        else:
            # as Dask will read it: a worker's name is an alias of its address, and a host
            # may be spelt another way (review 24b: "w1" removed w1); unknown: refused
            try:
                msg["address"] = server.coerce_address(msg.get("address"))
            except Exception:  # noqa: BLE001 - any address Dask cannot read is refused
                msg["address"] = None
            found = server.workers.get(msg["address"])
            whose = "an unknown worker" if found is None else str(found.name)
        if whose != name:
            raise PermissionError(f"the {kind} refused {op!r} about worker {whose!r} to the "
                                  f"certificate of {name!r}")
        result = handler(comm, **msg) if takes_comm else handler(**msg)
        return await result if inspect.isawaitable(result) else result

    own.__name__ = getattr(handler, "__name__", op)
    return own


def _streams(server: Any) -> None:
    """On the scheduler: a worker's stream carries only worker messages about itself, a
    client's only a client's (Dask merges the stream's ``worker``/``client`` into each
    message, and a message could name another)."""
    plain = server.handle_stream

    async def handle_stream(comm: Any, extra: Mapping[str, Any] | None = None) -> None:
        token = _STREAM.set(dict(extra or {}))
        try:
            await plain(comm=comm, extra=extra)
        finally:
            _STREAM.reset(token)

    server.handle_stream = handle_stream
    server.handlers["connection_stream"] = handle_stream
    for op, handler in list(server.stream_handlers.items()):
        side = "worker" if op in WORKER_STREAM_OPS else "client"
        if op == "log-event":
            # a worker's events are dropped: the scheduler published them to every client
            # subscribed to the topic, and Dask's client unpickles a "warn" event's message
            # (review 24a: a worker ran code in the coordinator that way)
            handler = _dropped
        server.stream_handlers[op] = _on_stream(op, handler, side, _FORWARDED.get(op, ()))


# what the scheduler keeps of a worker's message unopened and forwards to the clients that
# want the key, whose stream from the scheduler Dask reads with every serializer: a task's
# error and traceback (``task-erred``) and a result's type (``task-finished``, then
# ``key-in-memory``). Anything but plain bytes there is dropped (review 24b, F1: a worker's
# pickled "error" ran its code in the coordinator, and a failing tree PASSed)
_FORWARDED = {"task-erred": ("exception", "traceback"), "task-finished": ("type",)}


def _dropped(**_: Any) -> None:
    """A message taken from the stream it came on and not acted on."""


def _on_stream(op: str, handler: Callable[..., Any], side: str,
               plain: tuple[str, ...] = ()) -> Callable[..., Any]:
    """``handler`` answering ``op`` on ``side``'s own stream only, with the ``plain``
    fields (``_FORWARDED``) dropped unless they are bytes."""

    def check(kwargs: dict[str, Any]) -> None:
        extra = _STREAM.get(None)
        if extra is None or side not in extra or kwargs.get(side) != extra[side]:
            raise PermissionError(f"the scheduler refused {op!r} on a stream that is not "
                                  f"that {side}'s own")
        for field in plain:  # an error's objects always (its text fields say what happened)
            if field in ("exception", "traceback") or \
                    (field in kwargs and not isinstance(kwargs[field], bytes)):
                kwargs[field] = None

    if inspect.iscoroutinefunction(handler):
        async def guarded_async(**kwargs: Any) -> Any:
            check(kwargs)
            return await handler(**kwargs)
        return guarded_async

    def guarded(**kwargs: Any) -> Any:
        check(kwargs)
        return handler(**kwargs)
    return guarded


def guard(server: Any) -> None:
    """Guard ``server``'s operations and streams by its kind's rules (idempotent per
    server), and let its driver's messages carry pickles.

    Raises:
        RuntimeError: a Dask server of another kind, or a second kind in this process (each
            process pickles from one driver).
    """
    global _pickles_from
    kind = type(server).__name__.lower()
    if kind not in _RULES:
        raise RuntimeError(f"choir.distributed.guard does not know a Dask {kind}")
    if getattr(server, "_choir_guarded", False):
        return
    if _pickles_from and _pickles_from != DRIVER[kind]:
        raise RuntimeError("choir.distributed.guard guards one kind of Dask server per "
                           f"process; this one already runs another than a {kind}")
    _arm()
    server.handlers = _Handlers(server.handlers, server, kind)
    if kind == "scheduler":
        _streams(server)
    _pickles_from = DRIVER[kind]
    server._choir_guarded = True


def dask_setup(server: Any) -> None:
    """Dask's preload hook."""
    guard(server)


_arm()
