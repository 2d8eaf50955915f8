"""A CHOIR_HOME filled by Choir itself, and ``choir view`` serving it, for the viewer's tests.

The home holds real runs: a ``choir verify`` of the quickstart repo (a failing pytest, cited
by its report) with a hostile verifier beside it (script tags, ANSI and OSC sequences, a very
long line, then exit 1), and a ``choir run`` of the quickstart work item (FAIL, feedback,
PASS, ASSERT). ``ViewServer`` starts the real command and reads the URL it prints.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests import forked

ROOT = Path(__file__).resolve().parents[1]
LONG_LINE = 3_000_000  # bytes in the hostile verifier's one long line
HOSTILE = (
    "import sys\n"
    "w = sys.stdout.write\n"
    "w('<script>document.title=\"pwned\"</script><img src=x onerror=alert(1)>\\n')\n"
    "w('\\x1b[31mRED\\x1b[0m \\x1b]8;;https://evil.example/\\x07click\\x1b]8;;\\x07 '\n"
    "  '\\x1b]52;c;cHduZWQ=\\x07clip \\u202eevil\\n')\n"
    f"w('L' * {LONG_LINE} + '\\n')\n"
    "w('after the long line\\n')\n"
    "sys.exit(1)\n"
)


def sandbox() -> str:
    return "bwrap" if shutil.which("bwrap") else "local"


def env_for(home: Path) -> dict[str, str]:
    env = dict(os.environ, CHOIR_HOME=str(home), CHOIR_ARTIFACT_DIR=str(home / "artifacts"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for var in ("CHOIR_DATABASE_URL", "AGENT_ARTIFACT_DIR", "CHOIR_TRUSTED_KEYS"):
        env.pop(var, None)
    return env


def _choir(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return forked.run([sys.executable, "-m", "choir", *args], env=env, cwd=cwd,
                      capture_output=True, text=True, timeout=300)


def make_home(work: Path, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """Fill ``work/home`` with real runs; returns their ids (``verify``, ``run``).
    ``extra_env``: e.g. ``CHOIR_DATABASE_URL`` for a Postgres store."""
    home = work / "home"
    env = {**env_for(home), **(extra_env or {})}
    shutil.copytree(ROOT / "examples/quickstart", work / "qs")
    repo = work / "qs" / "repo"
    (repo / "hostile.py").write_text(HOSTILE)
    config = (repo / "choir.yaml").read_text()
    config = config.replace("moods:\n", "  hostile:\n    kind: smoke\n    steps:\n"
                            "      - name: shout\n"
                            "        command: python3 hostile.py\n"
                            "moods:\n")
    (repo / "choir.yaml").write_text(config.replace("CALM: {verifiers: [unit]}",
                                                    "CALM: {verifiers: [unit, hostile]}"))
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "buggy"], cwd=repo, check=True)
    verified = _choir(["verify", "--json", "--sandbox", sandbox()], env, repo)
    assert verified.returncode == 1, verified.stderr[-2000:]
    session = json.loads(verified.stdout)
    (repo / "choir.yaml").write_text(config)  # the run: unit only, FAIL then PASS
    subprocess.run([*git, "commit", "-qam", "unit only"], cwd=repo, check=True)
    ran = _choir(["run", str(work / "qs" / "workitem.yaml")], env, work)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    run_id = re.search(r"run (fix-add-\S+)", ran.stdout)
    assert run_id, ran.stdout
    return {"verify": session["run_id"], "run": run_id.group(1), "home": str(home)}


def run_plan(work: Path, home: Path, plan_id: str, items: str,
             promote_to: str = "") -> dict[str, object]:
    """A real ``choir plan run`` of ``items`` (plan YAML) over the team tests' tiny repo in
    ``work``, stored in ``home``, then ``choir promote`` to ``promote_to`` when given; the
    plan's record as the run printed it."""
    from tests.team import team_repo, write_plan

    team_repo(work / "repo")
    plan = write_plan(work, plan_id, items)
    env = env_for(home)
    ran = _choir(["plan", "run", str(plan), "--json"], env, work)
    assert ran.stdout.strip(), ran.stderr[-2000:]
    if promote_to:
        done = _choir(["promote", plan_id, "--to", promote_to], env, work)
        assert done.returncode == 0, done.stdout + done.stderr
    state: dict[str, object] = json.loads(ran.stdout)
    return state


class ViewServer:
    """``choir view`` on a free port over ``home``; ``url`` carries the token, ``base`` is
    the origin and the per-launch path prefix the viewer serves under (no trailing slash),
    ``origin`` the scheme, host and port alone."""

    def __init__(self, home: Path, extra_env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "choir", "view"], env={**env_for(home), **(extra_env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:(\d+)(?:/[\w-]+)?)/\?token=(\S+)", line)
        if not found:  # say why: its stderr, read before stop() closes it
            self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            raise AssertionError(f"choir view printed {line!r}; stderr {err[-3000:]}")
        self.base, self.port, self.token = found.group(1), int(found.group(2)), found.group(3)
        self.origin = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/?token={self.token}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


@contextmanager
def view_server(home: Path, extra_env: dict[str, str] | None = None) -> Iterator[ViewServer]:
    server = ViewServer(home, extra_env)
    try:
        yield server
    finally:
        server.stop()


def synthetic_runs(home: Path, artifacts: Path, n: int, *, traced_every: int = 5) -> None:
    """``n`` stored runs written through the stores' own writers, fast: verify session
    manifests (``write_session``), and every ``traced_every``-th a ``choir run`` trace
    (``TraceRecorder``). Alternating verdicts and three work items give the filters work."""
    from concurrent.futures import ThreadPoolExecutor
    from datetime import UTC, datetime, timedelta

    from choir.evidence.artifacts import ArtifactStore
    from choir.trace.record import TraceRecorder
    from choir.verification.session import SessionManifest, write_session

    store = ArtifactStore(artifacts)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def one(i: int) -> None:
        when = (t0 + timedelta(seconds=i)).isoformat()
        if traced_every and i % traced_every == 0:
            rec = TraceRecorder(f"item-{i % 3}-{i:06d}", home)
            rec.emit("run_started", name=f"item-{i % 3}",
                     data={"work_item": f"item-{i % 3}", "required": (), "mood": "CALM"})
            rec.emit("run_ended", data={"status": "asserted" if i % 3 else "halted",
                                        "reason": "synthetic"})
            rec._commit()  # written and sealed, as a node's events are
            return
        manifest = SessionManifest(
            run_id=f"verify-{i:06d}", status="PASS" if i % 3 else "FAIL", mood="CALM",
            timestamp_start=when, timestamp_end=when, commit_sha=None, tree_hash=f"{i:064x}",
            commands_executed=(), platform={"sandbox": "bwrap", "isolation": "namespace"},
            duration_ms=1, runs={}, attestations=())
        write_session(store, manifest.run_id, manifest.model_dump(mode="json"))

    with ThreadPoolExecutor(8) as pool:  # each write fsyncs; the waits overlap
        list(pool.map(one, range(n)))


def flip_byte(path: Path, offset: int = 0) -> None:
    """Change one byte of a stored (read-only) file in place, as an attacker with the
    user's rights could."""
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def session_attestations(home: Path, run_id: str) -> dict[str, object]:
    """verifier name -> its attestation, for a stored verify session."""
    from choir.attest import AttestationStore

    data = json.loads((home / "artifacts" / "runs" / run_id / "manifest.json").read_bytes())
    atts = AttestationStore(home / "attestations")
    return {a.body.verifier: a for a in (atts.get(i) for i in data["attestations"])}
