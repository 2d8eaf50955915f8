"""One hook on Dask's TCP reads, shared by the guard (the cluster's processes) and the
coordinator's bound on what it reads (``choir.distributed.fanout``)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def around_reads(var: contextvars.ContextVar[T], value: Callable[[Any], T],
                 refused: type[BaseException]) -> None:
    """Patch ``TCP.read`` (TLS's too) in this process: while a message is read, ``var``
    holds ``value(comm)``, for the code that reads it (unpickling, decompressing) to consult;
    a ``refused`` raised in there drops the connection (a ``CommClosedError`` to the reader,
    so Dask treats it as a lost peer), nothing of the message used. Call once per hook."""
    from distributed.comm import tcp
    from distributed.comm.core import CommClosedError

    plain: Any = tcp.TCP.read

    async def read(self: Any, deserializers: Any = None) -> Any:
        token = var.set(value(self))
        try:
            return await plain(self, deserializers)
        except refused as exc:
            self.abort()
            raise CommClosedError(str(exc)) from exc
        finally:
            var.reset(token)

    tcp.TCP.read = read  # type: ignore[method-assign]
