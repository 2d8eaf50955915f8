"""One verifier's steps in a sandbox: in order, stop at the first failure.

Output streams to ``logs/step-NN-NAME.log`` and ``logs/combined.log`` in the run folder in
constant memory, keeping only a bounded tail for people. What a run stores of its output is
capped by ``limits.out_mb`` like ``$CHOIR_OUT`` (``_LogCap``): a step printing gigabytes
had every byte stored. A timeout is a FAIL and no retry;
a sandbox that could not start is INCONCLUSIVE, distinct from a failing step. Afterwards
every file in the run folder is hashed into the manifest, whose own hash is signed later.
"""

from __future__ import annotations

import collections
import functools
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Literal

from choir.evidence.artifacts import ArtifactStore
from choir.evidence.collect import OutBounds
from choir.exceptions import ConfigError, IntegrityError
from choir.models import (
    AppliedLimits,
    CommandRecord,
    Interpreter,
    Platform,
    RunManifest,
    Target,
    VerifierSpec,
)
from choir.sandbox import Sandbox, stop
from choir.sandbox._interpreter import measure

TAIL_LINES = 200
TAIL_LINE_MAX = 2000
LOG_END_KEEP = 64 << 10  # of a cut step, its last bytes are kept too: the summary is there
Status = Literal["PASS", "FAIL", "INCONCLUSIVE"]


class _Tail:
    """The last lines of a stream, each capped, with truncation always marked."""

    def __init__(self) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._partial = bytearray()
        self._dropped = 0

    def feed(self, chunk: bytes) -> None:
        if chunk.count(b"\n") > TAIL_LINES:
            # only the lines after the last TAIL_LINES + 1 newlines can stay: splitting the
            # others one by one cost 50 s for 200 MB of short lines
            cut = len(chunk)
            for _ in range(TAIL_LINES + 1):
                cut = chunk.rindex(b"\n", 0, cut)
            self._partial.clear()
            self._dropped = 0
            chunk = chunk[cut + 1:]
        parts = chunk.split(b"\n")
        for i, part in enumerate(parts):
            room = TAIL_LINE_MAX + 1 - len(self._partial)
            if room > 0:
                self._partial += part[:room]
            self._dropped += max(0, len(part) - max(room, 0))
            if i < len(parts) - 1:
                self._flush()

    def _flush(self) -> None:
        text = self._partial[:TAIL_LINE_MAX].decode("utf-8", "replace")
        if len(self._partial) > TAIL_LINE_MAX or self._dropped:
            more = self._dropped + len(self._partial) - TAIL_LINE_MAX
            text += f" [... line truncated: {more} more bytes]"
        self.lines.append(text)
        self._partial.clear()
        self._dropped = 0

    def text(self) -> str:
        if self._partial:
            self._flush()
        return "\n".join(self.lines)


class _LogCap:
    """The run's log as stored: at most ``limits.out_mb`` of it, cut with a marker.

    The head of the output up to the cap (less ``keep`` bytes) is stored as it streams; past
    it, bytes are only counted, except the last ``keep`` bytes of the step, held in a ring
    and stored after the marker when the step ends. The step is not stopped: its exit code
    still counts, and a cut log PASSes only when a complete structured result decides
    (``choir.report.build``). The cap spans the run's steps: what one step stored, the next
    cannot; each later step stores its marker and last bytes only. Memory: ``keep`` bytes.
    """

    def __init__(self, cap_mb: int) -> None:
        self.cap_mb = cap_mb
        cap = cap_mb * 1024 * 1024
        self.keep = min(LOG_END_KEEP, cap // 4)
        self.room = cap - self.keep
        self.cut = 0  # bytes of the current step not stored
        self._end = bytearray()

    def admit(self, chunk: bytes) -> bytes:
        """The part of ``chunk`` to store now; the rest is counted and its end remembered."""
        take = chunk[:max(self.room, 0)]
        self.room -= len(take)
        rest = chunk[len(take):]
        if rest:
            self._end += rest
            if len(self._end) > self.keep:
                self.cut += len(self._end) - self.keep
                del self._end[:len(self._end) - self.keep]
        return take

    def sink(self, store: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """A sink that stores through ``store`` what the cap admits."""
        return lambda chunk: store(self.admit(chunk))

    def end_step(self, name: str) -> tuple[bytes, int | None]:
        """(the marker and kept end to store, bytes not stored) once step ``name`` ended."""
        if not self.cut:
            tail, self._end = bytes(self._end), bytearray()
            return tail, None
        cut, self.cut = self.cut, 0
        note = (f"\n[choir] log cut: {cut} bytes of step {name} not kept (the run's log is "
                f"capped at {self.cap_mb} MiB, limits.out_mb); its last {len(self._end)} "
                "bytes follow\n").encode()
        kept, self._end = note + bytes(self._end), bytearray()
        return kept, cut


@dataclass
class PipelineResult:
    """A finished run. ``tail_log`` is for people only: never graph state or prompts."""

    status: Status
    run_id: str
    run_dir: Path
    manifest: RunManifest
    manifest_hash: str
    artifacts: dict[str, str] = field(default_factory=dict)
    tail_log: str = ""
    infra_error: str | None = None


def run_verifier(spec: VerifierSpec, *, repo: Path, sandbox: Sandbox, store: ArtifactStore,
                 run_id: str, target: Target,
                 env: Mapping[str, str] | None = None) -> PipelineResult:
    """Run every step of ``spec`` and seal the run folder. Never raises for step failures.

    A run id names one run. If that run already sealed (a resumed green thread whose process
    died after the run), its stored result is returned and nothing runs again; a folder that
    never sealed (the process died mid-run) is set aside and the run starts over.

    Raises:
        IntegrityError: the run id already names a run of another verifier or tree.
    """
    # the interpreter the steps will run, vouched for before anything runs or is reused (a
    # vouch started when the sandbox opened is waited for here: ``Sandbox.vouched``)
    interpreter = _interpreter(sandbox, repo)
    replayed = replay_sealed(store, run_id, spec, target)
    if replayed is not None:
        return replayed
    store.set_aside(run_id)
    run_dir = store.run_dir(run_id)
    logs, out = run_dir / "logs", run_dir / "out"
    logs.mkdir(parents=True)
    out.mkdir()
    started = datetime.now(UTC)
    deadline = time.monotonic() + spec.timeout_s
    tail = _Tail()
    records: list[CommandRecord] = []
    applied: list[AppliedLimits | None] = []  # per step the sandbox actually ran
    status: Status = "PASS"
    infra_error: str | None = None
    total = 0
    step_env = {**spec.env, **(env or {})}
    cap = _LogCap(spec.limits.out_mb)
    # Each byte is stored once: a one-step verifier's combined.log is its step log (one
    # inode, so one object); the command and any failure are in the manifest and the tail.
    single = len(spec.steps) == 1
    # its steps belong to this run: a cancelled gate stops them alone (``stop.stop_runs``)
    with stop.running(run_id), open(logs / "combined.log", "wb") as combined:
        for number, step in enumerate(spec.steps, start=1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                records.append(CommandRecord(name=step.name, command=step.command, exit_code=124,
                                             duration_ms=0, timed_out=True))
                status = "FAIL"
                break
            header = f"$ {step.command}\n".encode()
            if not single:
                combined.write(header)
            tail.feed(header)
            with open(logs / f"step-{number:02d}-{step.name}.log", "wb") as step_log:
                sink = _sink(step_log, None if single else combined, tail)
                run = functools.partial(sandbox.exec, step.command, repo=repo, out_dir=out,
                                        env=step_env, timeout_s=remaining, limits=spec.limits,
                                        network=spec.network, sink=cap.sink(sink))
                # a plugin backend written before host lists is called as it always was
                result = run(hosts=spec.hosts) if spec.hosts else run()
                kept, cut = cap.end_step(step.name)
                sink(kept)
            total += result.output_bytes
            if result.limits_applied is not None or not result.infra_error:
                applied.append(result.limits_applied)  # a sandbox that never started: none
            if result.infra_error:
                infra_error = result.infra_error
                status = "INCONCLUSIVE"
                note = f"\n[choir] sandbox error: {infra_error}\n".encode()
                if not single:
                    combined.write(note)
                tail.feed(note)
                break
            records.append(CommandRecord(name=step.name, command=step.command,
                                         exit_code=result.exit_code,
                                         duration_ms=result.duration_ms,
                                         timed_out=result.timed_out,
                                         oom_killed=result.oom_killed,
                                         limit_exceeded=result.limit_exceeded,
                                         limits_applied=result.limits_applied,
                                         output_cut=cut))
            if result.timed_out or result.oom_killed or result.exit_code != 0:
                why = ("timed out" if result.timed_out else
                       "killed: out of memory" if result.oom_killed else
                       f"stopped: {result.limit_exceeded}" if result.limit_exceeded else
                       f"exit code {result.exit_code}")
                note = f"\n[choir] step {step.name} failed: {why}\n".encode()
                if not single:
                    combined.write(note)
                tail.feed(note)
                status = "FAIL"
                break
    only = logs / f"step-01-{spec.steps[0].name}.log"
    if single and only.exists():
        (logs / "combined.log").unlink()
        os.link(only, logs / "combined.log")
    for scratch in ("tmp", "cache", "home"):  # temporaries are not evidence
        store.discard(out / scratch)
    limits = spec.limits
    sealed = store.collect_run(run_id, OutBounds(files=limits.out_files, depth=limits.out_depth,
                                                  mb=limits.out_mb))
    files = sealed.files
    if sealed.exceeded and records and infra_error is None:
        status = "FAIL"  # the last step wrote past a bound of $CHOIR_OUT: it stopped there
        if not records[-1].limit_exceeded:
            records[-1] = records[-1].model_copy(update={"limit_exceeded": sealed.exceeded})
        tail.feed(f"\n[choir] {sealed.exceeded}: $CHOIR_OUT was set aside, not kept\n".encode())
    described = sandbox.describe()
    manifest = RunManifest(
        run_id=run_id, verifier=spec.name, status=status,
        timestamp_start=started, timestamp_end=datetime.now(UTC),
        commit_sha=target.commit_sha, tree_hash=target.tree_hash,
        commands_executed=tuple(records),
        platform=Platform(os=platform.system().lower(), arch=platform.machine(),
                          container_image=described.get("image"),
                          image_digest=described.get("image_digest"),
                          sandbox=sandbox.name, isolation=sandbox.isolation,
                          transfer=described.get("transfer"),  # type: ignore[arg-type]
                          limits_applied=AppliedLimits.weakest(applied),
                          interpreter=interpreter, binds=sandbox.binds),
        infra_error=infra_error[:1000] if infra_error else None,
        files=files, bytes_logged=total,
    )
    manifest_hash = store.write_manifest(run_id, manifest)
    return PipelineResult(status=status, run_id=run_id, run_dir=run_dir, manifest=manifest,
                          manifest_hash=manifest_hash, artifacts=files, tail_log=tail.text(),
                          infra_error=infra_error)


def _interpreter(sandbox: Sandbox, repo: Path) -> Interpreter | None:
    """What the steps will run: as vouched for when the sandbox opened (waiting for a vouch
    still running), else measured now (a sandbox not opened by ``open_sandbox``: a cluster
    worker's, a test's).

    Raises:
        UserError: the vouch refused the interpreter.
    """
    found = sandbox.vouched()
    if found is not None:
        return found
    try:
        tools = sandbox.toolchain(repo)
        return measure(tools, repo) if tools is not None else None
    except (OSError, ConfigError):
        return None  # the steps could not have run it either; the infra error says why


def replay_sealed(store: ArtifactStore, run_id: str, spec: VerifierSpec,
                  target: Target) -> PipelineResult | None:
    """The stored result of ``run_id`` when it sealed already, else None.

    Only for the same verifier, tree and steps: a run id another runner (a shared artifact
    store), another configuration or a reused ``--run-id`` sealed must not stand for this one.

    Raises:
        IntegrityError: the run id names a run of another verifier, tree or steps.
    """
    sealed = store.sealed(run_id)
    if sealed is not None:
        manifest = sealed[0]
        if (manifest.verifier, manifest.tree_hash) != (spec.name, target.tree_hash):
            raise IntegrityError(
                f"run id {run_id} already names a run of '{manifest.verifier}' on tree "
                f"{manifest.tree_hash[:12]}, not of '{spec.name}' on {target.tree_hash[:12]}")
        if not ran_spec_steps(manifest, spec):
            raise IntegrityError(
                f"run id {run_id} already names a run of '{spec.name}' with other steps; its "
                "result stands for the commands it ran, not these: give the run another id")
        return stored_result(store, run_id, *sealed)
    return None


def ran_spec_steps(manifest: RunManifest, spec: VerifierSpec) -> bool:
    """Whether a sealed run ran ``spec``'s steps: each recorded step is the spec's at its
    place (a run stops at its first failing step), and a PASS ran every one of them."""
    ran = [(c.name, c.command) for c in manifest.commands_executed]
    wanted = [(s.name, s.command) for s in spec.steps]
    if manifest.status == "PASS" and len(ran) != len(wanted):
        return False
    return ran == wanted[:len(ran)]


def stored_result(store: ArtifactStore, run_id: str, manifest: RunManifest,
                  manifest_hash: str) -> PipelineResult:
    """The result of a run already sealed in ``store`` (a replay, or one landed from a
    cluster worker), its tail read back from the stored combined log."""
    tail = _Tail()
    combined = manifest.files.get("logs/combined.log")
    if combined is not None:
        with store.open(combined) as fh:
            for chunk in iter(lambda: fh.read(1 << 16), b""):
                tail.feed(chunk)
    return PipelineResult(status=manifest.status, run_id=run_id, run_dir=store.run_dir(run_id),
                          manifest=manifest, manifest_hash=manifest_hash,
                          artifacts=dict(manifest.files), tail_log=tail.text(),
                          infra_error=manifest.infra_error)


def _sink(step_log: BinaryIO, combined: BinaryIO | None, tail: _Tail):  # type: ignore[no-untyped-def]
    def write(chunk: bytes) -> None:
        if not chunk:
            return
        step_log.write(chunk)
        if combined is not None:
            combined.write(chunk)
        tail.feed(chunk)

    return write
