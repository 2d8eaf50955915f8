"""The systems postconditions act on in tests: a real SQLite file and a real HTTP service on
127.0.0.1 (port 0), both started by the test and readable from inside the sandbox."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def flag_db(folder: Path, rows: dict[str, str]) -> Path:
    """A SQLite database of flags, readable by the sandbox's user (nobody)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    path = folder / "flags.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE flags (name TEXT PRIMARY KEY, value TEXT)")
    con.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
    con.executemany("INSERT INTO flags VALUES (?, ?)", rows.items())
    con.executemany("INSERT INTO accounts VALUES (?, ?)", [(1, 100), (2, 50)])
    con.commit()
    con.close()
    path.chmod(0o644)
    return path


def write_later(path: Path, sql: str, args: tuple[Any, ...],
                after: threading.Event | None = None) -> threading.Thread:
    """Apply a write once ``after`` is set (at once without it): a mutation that becomes
    visible only when the test says so, i.e. after the postcondition's deadline."""
    def apply() -> None:
        if after is not None:
            after.wait(60)
        con = sqlite3.connect(path)
        con.execute(sql, args)
        con.commit()
        con.close()

    thread = threading.Thread(target=apply, daemon=True)
    thread.start()
    return thread


class Service:
    """State an HTTP service exposes: flags, a health status, and a path that hangs."""

    def __init__(self) -> None:
        self.flags: dict[str, str] = {}
        self.health = 200
        self.hang = threading.Event()
        self.requests: list[str] = []


@contextmanager
def http_service() -> Iterator[tuple[str, Service]]:
    state = Service()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            state.requests.append(self.path)
            if self.path.startswith("/slow"):
                state.hang.wait(10)
                status, body = 200, {}
            elif self.path == "/health":
                status, body = state.health, {}
            elif self.path.startswith("/flags/"):
                name = self.path.removeprefix("/flags/")
                if name not in state.flags:
                    status, body = 404, {}
                else:
                    status, body = 200, {"value": state.flags[name]}
            else:
                status, body = 404, {}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        state.hang.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
