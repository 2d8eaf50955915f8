"""The check of a parked tree against its record, in this process or beside it.

A claimed base (``choir.evidence.sealer``) is trusted entry by entry only where its
``lstat`` is exactly the stamp recorded when it was sealed (inode, size, mtime, ctime,
mode: ``choir.evidence.store``). At 50,000 files that comparison is about 0.15 s of one
core, and the scan of the live tree, which does not need its answer until it ends, is
another 0.45 s of the same core. So a big base is checked by a child process on another
core (``Beside``) while the scan runs; the caller reconciles the answer with what the scan
assumed before it builds anything (``Sealer.reconcile``). A small one is checked here: a
child costs about 40 ms of interpreter start.

The child is Choir's own code, from the folder this module was imported from, reading
Choir's own store (``python -I -c ... ROOT RECORD``): it is given two paths, prints which
record it read (the files' own checks, ``Table.loaded``) and how many rows, then the paths
off their record, how many they are, and an end mark. A child that fails, is killed or stopped past
``WAIT_S``, read another record than the caller did, or whose answer is cut short gives no
answer, and the caller checks in process instead.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

from choir._core import fsopen, procs
from choir.evidence import _table
from choir.evidence.store import RECORD

SPAWN_ROWS = 20_000  # a base with at least this many rows is checked beside the scan
WAIT_S = 120.0  # a child still not done then (stopped, say) is killed: checked in process
_END = b"end"  # the answer's last field: one cut short is not taken
# the child runs this very code: the folder Choir was imported from comes first on its path
# (``-I`` drops PYTHONPATH and the user's site; an installed Choir of another version, or
# none, is never what answers)
_CODE = str(Path(__file__).resolve().parents[2])
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
          "from choir.evidence.stamps import main; sys.exit(main(sys.argv[2:]))")


def off_record(root: Path, rows: _table.Rows) -> set[str]:
    """The paths of ``rows`` whose entry under ``root`` is missing or off its stamp."""
    rels = sorted(rows.keys())
    bad: set[str] = set()
    for rel, st in zip(rels, fsopen.lstat_many(root, rels), strict=True):
        row = rows[rel]
        if isinstance(st, OSError) or st.st_ctime_ns != row[3] or st.st_ino != row[0] \
                or st.st_mtime_ns != row[2] or st.st_size != row[1] \
                or st.st_mode != row[4]:
            bad.add(rel)
    return bad


class Beside:
    """``off_record`` of the tree at ``root`` against the record file ``record``, in a child
    process started now; ``result`` waits for it. ``loaded`` and ``rows``: what the caller
    read of that record (``Table.loaded``, its row count), which the child's answer must
    be about."""

    def __init__(self, root: Path, record: Path, loaded: str, rows: int) -> None:
        self._want = f"{loaded}\0{rows}".encode()
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD, _CODE, str(root), str(record)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            close_fds=True)

    def result(self) -> set[str] | None:
        """The paths off their record, or None when the child gave no usable answer: it
        failed, was stopped past ``WAIT_S``, read another record, or its answer is cut."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        out = procs.output(proc, WAIT_S)
        if out is None:
            return None
        fields = out.split(b"\0")
        if len(fields) < 4 or b"\0".join(fields[:2]) != self._want or fields[-1] != _END \
                or fields[-2] != str(len(fields) - 4).encode():
            return None  # the count before the end mark: a path named "end" ends nothing
        return {p.decode("utf-8", "surrogateescape") for p in fields[2:-2] if p}

    def close(self) -> None:
        """Stop a child whose answer is no longer wanted (the scan failed)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.communicate()


def main(argv: list[str]) -> int:
    root, record = Path(argv[0]), Path(argv[1])
    table = _table.Table(record, RECORD)
    bad = off_record(root, table.rows)
    sys.stdout.buffer.write(b"\0".join([table.loaded.encode(), str(len(table.rows)).encode(),
                                         *(p.encode("utf-8", "surrogateescape")
                                           for p in sorted(bad)), str(len(bad)).encode(),
                                         _END]))
    return 0
