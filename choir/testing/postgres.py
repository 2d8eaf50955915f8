"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` + ``postgres`` in a dir.

Real Postgres, not a fake: the Debian/Ubuntu binaries under ``/usr/lib/postgresql/*/bin`` (or
on ``PATH``). The server listens only on a Unix socket inside its own directory (no TCP port,
so parallel test workers never collide) and trusts local connections. Postgres refuses to run
as root, so under root it runs as ``nobody`` and the directories it needs are opened to it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote


def pg_bin() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, or None when not installed."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).parent
    for cand in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (cand / "initdb").is_file() and (cand / "postgres").is_file():
            return cand
    return None


@dataclass
class PgServer:
    """A running server; ``url(db)`` names one database on it."""

    root: Path
    proc: subprocess.Popen[bytes]
    user: str = "choir"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@/{dbname}?host={quote(str(self.socket_dir), safe='')}"

    def create_database(self, prefix: str = "t") -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = f"{prefix}_{secrets.token_hex(6)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: "smart" shutdown; children exit with it
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _open_path_to(path: Path) -> None:
    """Let ``nobody`` traverse (not list) every directory down to ``path``."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)


def start_server(root: Path, *, durable: bool = False) -> PgServer:
    """initdb a cluster under ``root`` and start it; ``durable=False`` turns fsync off.

    Raises:
        RuntimeError: no binaries, or the server did not come up (its log is in the message).
    """
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError("no initdb/postgres binary found (apt-get install postgresql)")
    root.mkdir(parents=True, exist_ok=True)
    data, sock = root / "data", root / "sock"
    sock.mkdir(exist_ok=True)
    kwargs: dict[str, object] = {}
    if os.geteuid() == 0:
        import pwd

        nobody = pwd.getpwnam("nobody")
        _open_path_to(root)
        for d in (root, sock):
            os.chown(d, nobody.pw_uid, nobody.pw_gid)
        kwargs = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
    for attempt in range(3):
        if os.geteuid() == 0:  # another pytest session may have reset its base dir to 0700
            _open_path_to(root)
        done = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "choir",
                               "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              **kwargs)  # type: ignore[call-overload]
        if not done.returncode:
            break
        if attempt == 2 or b"Permission denied" not in done.stderr:
            raise RuntimeError(f"initdb failed in {data}: "
                               f"{done.stderr.decode(errors='replace')}")
        time.sleep(0.2)
        subprocess.run(["rm", "-rf", str(data)], check=False)
    opts = ["-c", "listen_addresses=", "-c", f"unix_socket_directories={sock}",
            "-c", "max_connections=100", "-c", "shared_buffers=32MB"]
    if not durable:
        opts += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
    for attempt in range(3):  # a base dir reset to 0700 meanwhile stops it at its start too
        if os.geteuid() == 0:
            _open_path_to(root)
        log = open(root / "server.log", "wb")  # noqa: SIM115 - the server's lifetime
        proc = subprocess.Popen([str(bindir / "postgres"), "-D", str(data), *opts], env=env,
                                stdout=log, stderr=subprocess.STDOUT, **kwargs)  # type: ignore[call-overload]
        log.close()
        server = PgServer(root, proc)
        if os.geteuid() == 0:
            _open_path_to(root)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if (sock / ".s.PGSQL.5432").exists():
                try:
                    import psycopg

                    psycopg.connect(server.url(), connect_timeout=2).close()
                    return server
                except Exception:  # noqa: BLE001 - still starting
                    pass
            time.sleep(0.05)
        server.stop()
        said = (root / "server.log").read_text(errors="replace")
        if attempt == 2 or "Permission denied" not in said:
            break
        time.sleep(0.2)
    raise RuntimeError("postgres did not start: " +
                       (root / "server.log").read_text(errors="replace")[-2000:])
