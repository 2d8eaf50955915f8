"""the run-folder log layout (docs/concepts.md) under a ``choir verify`` session's own ``run_id``.

A session's ``run_id`` names ``runs/{run_id}/``, and a consumer of the run-folder contract looks
there for ``logs/combined.log`` and ``logs/step-NN-NAME.log``. The bytes live in the verifier
runs the session lists (each attested); the session folder gets a hard link per step log, in
``commands_executed`` order, and one combined log (every run's, under a ``==> RUN_ID <==``
header). ``choir audit`` re-derives both from the runs, so they are evidence-backed copies,
never a place to put other bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import blake3

from choir.evidence.artifacts import hash_file

CHUNK = 1 << 20


def run_order(commands: Sequence[Any], runs: Sequence[str]) -> list[str]:
    """The session's runs in ``commands_executed`` order (the manifest's ``runs`` mapping is
    stored with sorted keys), then any run without a command."""
    order = list(dict.fromkeys(c.run_id for c in commands))
    return order + sorted(set(runs) - set(order))


def _layout(runs_root: Path, order: Sequence[str]) -> Iterator[tuple[str, Path]]:
    """(name under ``logs/``, the run's own step log) for every step log, numbered."""
    number = 0
    for run_id in order:
        for step in sorted((runs_root / run_id / "logs").glob("step-*.log")):
            number += 1
            yield f"step-{number:02d}-{step.name.split('-', 2)[2]}", step


def _combined(runs_root: Path, order: Sequence[str]) -> Iterator[bytes]:
    for run_id in order:
        yield f"==> {run_id} <==\n".encode()
        source = runs_root / run_id / "logs" / "combined.log"
        if source.is_file() and not source.is_symlink():
            with open(source, "rb") as fh:
                yield from iter(lambda: fh.read(CHUNK), b"")


def write_session_logs(folder: Path, order: Sequence[str]) -> None:
    """Write ``folder/logs`` once, read-only: hard links (no byte stored twice) and the
    combined log, copied in bounded chunks."""
    logs = folder / "logs"
    logs.mkdir()
    for name, step in _layout(folder.parent, order):
        os.link(step, logs / name, follow_symlinks=False)
    with open(logs / "combined.log", "xb") as out:
        for chunk in _combined(folder.parent, order):
            out.write(chunk)
        os.fchmod(out.fileno(), 0o444)


def _digest(path: Path) -> str | None:
    if not path.is_file() or path.is_symlink():
        return None
    return hash_file(path)


def check_session_logs(folder: Path, order: Sequence[str]) -> list[tuple[str, str, str]]:
    """(kind, expected, found) for every way ``folder/logs`` differs from what the runs
    re-derive: a missing, extra or changed step log, or a changed combined log."""
    logs = folder / "logs"
    if not logs.is_dir():
        return [("session_logs", "logs/ with the run-folder layout", "missing")]
    problems: list[tuple[str, str, str]] = []
    want = dict(_layout(folder.parent, order))
    present = {p.name for p in logs.iterdir()} - {"combined.log"}
    for name in sorted(present - set(want)):
        problems.append(("session_log_extra", "not present", f"logs/{name}"))
    for name, step in sorted(want.items()):
        got = _digest(logs / name)
        if got != _digest(step):
            problems.append(("session_log", f"logs/{name} as in {step.parent.parent.name}",
                             "missing" if got is None else f"changed ({got[:16]})"))
    h = blake3.blake3()
    for chunk in _combined(folder.parent, order):
        h.update(chunk)
    got = _digest(logs / "combined.log")
    if got != h.hexdigest():
        problems.append(("session_log", "logs/combined.log re-derived from the runs",
                         "missing" if got is None else f"changed ({got[:16]})"))
    return problems
