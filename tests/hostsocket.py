"""A host service on a Unix socket, for the tests that show no sandbox reaches one."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path


class Listener:
    """Listens on ``path`` (mode 0777, as a careless host service leaves it) and records the
    first bytes one connection sends, in ``heard`` once ``close`` returned."""

    def __init__(self, path: Path, timeout: float = 10) -> None:
        self.heard: list[bytes] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._server.bind(str(path))
        except OSError:
            self._server.close()
            raise
        os.chmod(path, 0o777)
        self._server.listen(1)
        self._server.settimeout(timeout)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self._server.accept()
            self.heard.append(conn.recv(64))
            conn.close()
        except OSError:
            pass

    def close(self) -> list[bytes]:
        """Stop listening (a connection already taken is read to its end) and say what was
        heard."""
        self._server.close()
        self._thread.join(5)
        return self.heard


def connecting(path: Path) -> str:
    """A shell command that sends ``ESCAPED`` to the socket at ``path``, then writes
    ``seen.txt`` (``done``) in its working folder whether or not it could."""
    from tests.workitems import PY

    return (f"{PY} -c \"import socket; s = socket.socket(socket.AF_UNIX); "
            f"s.connect('{path}'); s.sendall(b'ESCAPED')\"; echo done > seen.txt")
