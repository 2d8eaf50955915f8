"""``choir audit`` never crashes: every stored object, deleted or corrupted in turn, is a
named violation with exit 1, never a traceback.

The home is real: a ``choir verify`` session and a ``choir run`` that fails, is fixed and
ASSERTs, in real sandboxes. Each case copies it, breaks one thing, and audits the copy in a
fresh process.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests import forked
from tests.workitems import PY, calc_repo, fixing_item

# every stored file broken every way, ~2 minutes of real homes: CI's slow stage runs it
pytestmark = pytest.mark.slow

Mutation = Callable[[Path], None]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CHOIR_DATABASE_URL"}
    return {**env, "CHOIR_HOME": str(home), "CHOIR_ARTIFACT_DIR": str(home / "artifacts")}


def _choir(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return forked.run([PY, "-m", "choir", *args], capture_output=True, text=True,
                      timeout=300, env=_env(home), cwd=home.parent)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home after a real ``choir verify`` and a real ``choir run`` that ASSERTs; clean."""
    root = tmp_path_factory.mktemp("world")
    home = root / "home"
    calc_repo(root / "repo", canary="c")
    item = fixing_item(root)
    _choir(home, "verify", "--repo", str(root / "repo"))
    run = _choir(home, "run", str(item), "--run-id", "r1", "--json")
    assert json.loads(run.stdout)["status"] == "asserted", run.stderr
    audit = _choir(home, "audit")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    # Into the main file with every page, so that breaking "the AHDB file" breaks the log
    # (with the pages still in the write-ahead log a cut main file loses nothing)
    conn = sqlite3.connect(home / "ahdb.sqlite")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return home


# -- what is broken: one file of each kind ---------------------------------------------------
def _attestations(home: Path) -> list[Path]:
    return sorted((home / "attestations").glob("*.json"))


def _reports(home: Path) -> list[Path]:
    ids = [json.loads(p.read_text())["body"]["report_hash"] for p in _attestations(home)]
    return [home / "artifacts" / "objects" / h[:2] / h[2:] for h in ids]


def _logs(home: Path) -> list[Path]:
    ids = [json.loads(p.read_text())["body"]["artifacts"]["logs/combined.log"]
           for p in _attestations(home)]
    return [home / "artifacts" / "objects" / h[:2] / h[2:] for h in ids]


def _manifests(home: Path) -> list[Path]:
    return sorted((home / "artifacts" / "runs").glob("*/manifest.json"))


FILES: dict[str, Callable[[Path], list[Path]]] = {
    "attestation": _attestations,
    "report": _reports,
    "artifact": _logs,
    "manifest": _manifests,
    "heads": lambda home: [home / "ahdb.sqlite.heads"],
    "trace": lambda home: sorted((home / "traces").glob("*.jsonl")),
    "run folder": lambda home: sorted(p for p in (home / "artifacts" / "runs").iterdir()),
    "ahdb file": lambda home: [home / "ahdb.sqlite"],
}


def _delete(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


def _truncate(path: Path) -> None:
    """Torn: cut mid-record. (A cut exactly at a record boundary of the heads log is a
    rollback, which only an anchor outside the home can catch: test_rollback.py.) Half the
    file minus one byte is never a boundary of SQLite pages; in a heads log of an even number
    of equal-length lines it drops just a line end, and a record without one is torn too."""
    if path.is_dir():
        return _delete(path)
    data = path.read_bytes()
    os.chmod(path, 0o644)
    path.write_bytes(data[: len(data) // 2 - 1])


def _garbage(path: Path) -> None:
    _delete(path)
    path.write_bytes(b"\x00\xff{not json at all\n\x00")


def _wrong_shape(path: Path) -> None:
    _delete(path)
    path.write_bytes(b'[1, "two", {"three": null}]\n')


def _directory(path: Path) -> None:
    """Present, but unreadable as a file (permissions do not stop root; this does)."""
    _delete(path)
    path.mkdir()


def _dangling(path: Path) -> None:
    _delete(path)
    path.symlink_to(path.parent / "nowhere")


FILE_MUTATIONS: dict[str, Mutation] = {
    "deleted": _delete, "truncated": _truncate, "garbage": _garbage,
    "wrong shape": _wrong_shape, "a directory": _directory, "dangling link": _dangling}


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:  # type: ignore[type-arg]
    data = json.loads(path.read_text())
    edit(data)
    os.chmod(path, 0o644)
    path.write_text(json.dumps(data))


def _sql(*statements: str) -> Mutation:
    def run(home: Path) -> None:
        conn = sqlite3.connect(home / "ahdb.sqlite")
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        conn.execute("DROP TRIGGER IF EXISTS events_no_delete")
        for statement in statements:
            conn.execute(statement)
        conn.commit()
        conn.close()

    return run


def _heads_line(line: bytes) -> Mutation:
    def run(home: Path) -> None:
        path = home / "ahdb.sqlite.heads"
        path.write_bytes(path.read_bytes() + line)

    return run


def _head_field(field: str, value: object) -> Mutation:
    def run(home: Path) -> None:
        path = home / "ahdb.sqlite.heads"
        lines = path.read_bytes().splitlines()
        last = json.loads(lines[-1])
        last[field] = value
        path.write_bytes(b"\n".join([*lines[:-1], json.dumps(last).encode()]) + b"\n")

    return run


def _att_field(field: str, value: object) -> Mutation:
    def run(home: Path) -> None:
        _edit_json(_attestations(home)[0], lambda d: d.__setitem__(field, value))

    return run


OTHER: dict[str, Mutation] = {
    "attestation signature not base64": _att_field("signature", "!!not base64!!"),
    "attestation public key not base64": _att_field("public_key", "%%%"),
    "attestation public key a number": _att_field("public_key", 7),
    "event payload not JSON": _sql("UPDATE events SET payload = '{oops' WHERE seq = 2"),
    "event payload a list": _sql("UPDATE events SET payload = '[1, 2]' WHERE seq = 2"),
    "event payload null": _sql("UPDATE events SET payload = 'null' WHERE seq = 1"),
    "event time garbage": _sql("UPDATE events SET created_at = 'yesterday' WHERE seq = 2"),
    "event seq moved": _sql("UPDATE events SET seq = seq + 100 WHERE seq = 3"),
    "event points at no attestation": _sql(
        "UPDATE events SET payload = '{\"attestation\": \"" + "f" * 64 + "\"}' "
        "WHERE kind = 'outcome'"),
    "event points outside the store": _sql(
        "UPDATE events SET payload = '{\"attestation\": \"../../keys/ed25519\"}' "
        "WHERE kind = 'outcome'"),
    "event deleted": _sql("DELETE FROM events WHERE seq = 2"),
    "events table dropped": _sql("DROP TABLE events"),
    "atom body garbage": _sql("UPDATE atoms SET body = 'garbage'"),
    "atom body null": _sql("UPDATE atoms SET body = 'null', kind = 7"),
    "atoms table dropped": _sql("DROP TABLE atoms"),
    "fails row for nothing": _sql("INSERT INTO fails VALUES ('x', 'y', 'z')"),
    "fails row of numbers": _sql("INSERT INTO fails VALUES (1, 2, 3)"),
    "outcome row for nothing": _sql("INSERT INTO outcomes VALUES ('nothing', 1)"),
    "heads line garbage": _heads_line(b"\x00\xffnot json\n"),
    "heads line a list": _heads_line(b"[1, 2]\n"),
    "heads seq a string": _head_field("seq", "seven"),
    "heads signature not base64": _head_field("signature", "!!!"),
    "heads public key garbage": _head_field("public_key", "%%%"),
    "heads public key a number": _head_field("public_key", 12),
    # the database's own copy of each signed head (committed with its event), and the file's
    "heads rows and file deleted": lambda home: (
        _sql("DROP TRIGGER heads_no_delete", "DELETE FROM heads")(home),
        (home / "ahdb.sqlite.heads").unlink()),
    "heads row garbage": _sql("INSERT INTO heads (record) VALUES (x'00ff')"),
    "objects folder deleted": lambda home: shutil.rmtree(home / "artifacts" / "objects"),
    "attestations folder a file": lambda home: (shutil.rmtree(home / "attestations"),
                                                (home / "attestations").write_text("x")),
}


def _broken(pristine: Path, where: Path, mutate: Mutation) -> tuple[str, dict]:  # type: ignore[type-arg]
    home = where / "home"
    shutil.copytree(pristine, home, symlinks=True)
    for path in (home / "artifacts").rglob("*"):  # the store is read-only by design
        if not path.is_symlink():
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    mutate(home)
    proc = _choir(home, "audit", "--json")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stderr, json.loads(proc.stdout)


def _each(pristine: Path, tmp_path: Path, cases: list[tuple[str, Mutation]]) -> None:
    def one(n_case: tuple[int, tuple[str, Mutation]]) -> str | None:
        n, (name, mutate) = n_case
        try:
            _, out = _broken(pristine, tmp_path / str(n), mutate)
        except AssertionError as exc:
            return f"{name}: {str(exc)[:1500]}"
        if not out["violations"]:
            return f"{name}: exit 1 but no violation named"
        return None

    with ThreadPoolExecutor(max_workers=2) as pool:
        problems = [p for p in pool.map(one, enumerate(cases)) if p]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kind", sorted(FILES))
def test_every_stored_file_broken_any_way_is_a_violation(
        pristine: Path, tmp_path: Path, kind: str) -> None:
    paths = FILES[kind](pristine)
    assert paths, kind
    picked = [paths[0], paths[-1]] if len(paths) > 1 else paths
    cases = [(f"{kind} {p.relative_to(pristine)} {how}",
              lambda home, p=p, m=mutate: m(home / p.relative_to(pristine)))
             for p in picked for how, mutate in FILE_MUTATIONS.items()
             # the heads file is a copy of the records the database holds with their events:
             # without it nothing is lost (both gone: "heads rows and file deleted")
             if (kind, how) != ("heads", "deleted")]
    _each(pristine, tmp_path, cases)


def test_every_row_and_record_broken_is_a_violation(pristine: Path, tmp_path: Path) -> None:
    _each(pristine, tmp_path, sorted(OTHER.items()))


# -- review 21, F2: a FIFO or a link to /dev/zero planted in the home ---------------------------
PLANTED = {  # where: what audit must say (exit 1 and a violation, or exit 2 naming the file)
    "ahdb.sqlite.heads": 1,
    "artifacts/runs/UNIT/manifest.json": 1,
    "trusted_keys": 2,
    "revoked_keys": 2,
    "keys/ed25519.pub": 0,  # derived from the key: written afresh, nothing lost
}


def _limited() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))  # /dev/zero read whole: dies


@pytest.mark.parametrize("how", ["fifo", "zero"])
def test_a_fifo_or_dev_zero_planted_is_named_never_waited_on(
        pristine: Path, tmp_path: Path, how: str) -> None:
    unit = next(p.name for p in sorted((pristine / "artifacts" / "runs").iterdir())
                if "-unit-" in p.name)

    def one(n_where: tuple[int, str]) -> str | None:
        n, where = n_where
        home = tmp_path / str(n) / "home"
        shutil.copytree(pristine, home, symlinks=True)
        path = home / where.replace("UNIT", unit)
        os.chmod(path.parent, 0o755)
        path.unlink(missing_ok=True)
        os.mkfifo(path) if how == "fifo" else path.symlink_to("/dev/zero")
        try:
            # cold: its limits are set between the fork and the interpreter's start
            proc = subprocess.run([PY, "-m", "choir", "audit", "--json"], capture_output=True,
                                  text=True, timeout=60, env=_env(home), cwd=home.parent,
                                  preexec_fn=_limited)
        except subprocess.TimeoutExpired:
            return f"{where}: audit hung"
        want = PLANTED[where]
        if "Traceback" in proc.stderr or proc.returncode != want:
            return f"{where}: exit {proc.returncode}, not {want}: {proc.stderr[-800:]}"
        if want == 1 and not json.loads(proc.stdout)["violations"]:
            return f"{where}: exit 1 but no violation named"
        if want == 2 and where not in proc.stderr:
            return f"{where}: exit 2 without naming the file: {proc.stderr[-500:]}"
        return None

    with ThreadPoolExecutor(max_workers=2) as pool:
        problems = [p for p in pool.map(one, enumerate(PLANTED)) if p]
    assert not problems, "\n".join(problems)
