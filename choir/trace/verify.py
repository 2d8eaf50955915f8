"""The trace verifier (docs/trace.md): fail closed on anything not proven well-formed and grounded.

Every check runs on the whole trace and names its failures; there are no warnings. ``version``
and ``schema`` come first: a trace of a version Choir does not support, or one that does not
validate, is rejected without looking further, and the checks that could not run are reported
as not passed (never passed by default). Evidence is looked up in the artifact store by hash
and re-hashed (blake3) while streaming; the same pass counts the file's lines and notes where
each cited span's lines begin, and each span is then hashed by its byte range, so the cost
is the evidence bytes plus the cited bytes (both capped), and memory is the read chunk.

The trace file is hostile: its size is capped before it is read, a nesting bomb fails as
``schema``, and the models bound every collection and string.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import blake3
from pydantic import Field, ValidationError

from choir.exceptions import UserError
from choir.models._base import Frozen
from choir.trace.grounding import GROUNDING_CHECKS, RecordSources, check_grounding
from choir.trace.model import (
    SUPPORTED_PLAN_VERSIONS,
    SUPPORTED_TRACE_VERSIONS,
    Trace,
    TraceCitation,
)

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore

MAX_TRACE_BYTES = 64 << 20
MAX_FAILURES = 1000
# a citation's cost is its bytes: distinct spans per evidence file, and bytes of spans in all
# (a span of a whole file is its digest, free), are capped; past either, ``citation_span``
# fails without hashing (a hostile trace once cited one file by 288,000 spans)
MAX_SPANS_PER_ARTIFACT = 4096
MAX_CITED_BYTES = 1 << 30
TRACE_CHECKS = ("schema", "version", "ordering", "tool_linkage", "required_steps",
                "citation_marker", "citation_span", "citation_hash", "evidence_integrity",
                "insufficient_evidence")
CHECKS = TRACE_CHECKS + GROUNDING_CHECKS  # what `choir trace verify` and `choir audit` run
_MARKER = re.compile(r"\[@([^\]\s]{0,12})\]")
_CHUNK = 1 << 20


class CheckResult(Frozen):
    name: str
    passed: bool


class Failure(Frozen):
    check: str
    severity: Literal["error"] = "error"
    where: str = Field(max_length=300)
    detail: str = Field(max_length=600)


class TraceVerification(Frozen):
    """The verifier's report: ``ok`` only when every check ran and passed."""

    ok: bool
    checks: tuple[CheckResult, ...]
    failures: tuple[Failure, ...]
    summary_metrics: dict[str, int]


class _Failures:
    def __init__(self) -> None:
        self.items: list[Failure] = []
        self.failed: set[str] = set()
        self.dropped = 0

    def add(self, check: str, where: str, detail: str) -> None:
        self.failed.add(check)
        if len(self.items) >= MAX_FAILURES:
            self.dropped += 1
            return
        self.items.append(Failure(check=check, where=where[:300], detail=detail[:600]))


def _report(fails: _Failures, ran: set[str], metrics: dict[str, int],
              names: tuple[str, ...]) -> TraceVerification:
    checks = tuple(CheckResult(name=c, passed=c in ran and c not in fails.failed)
                   for c in names)
    return TraceVerification(ok=all(c.passed for c in checks), checks=checks,
                             failures=tuple(fails.items),
                             summary_metrics={**metrics, "failures": len(fails.items)
                                              + fails.dropped})


def read_trace_file(path: Path) -> bytes:
    """The bytes of a trace file, size-capped.

    Raises:
        UserError: the file is missing or unreadable (exit 2).
    """
    try:
        with open(path, "rb") as fh:
            return fh.read(MAX_TRACE_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read the trace file ({exc.strerror}); give the path "
                        "of a file written by `choir trace export RUN_ID -o FILE`") from None


def parse_trace_json(data: bytes, path: Path | str) -> Any:
    """The JSON value of a trace file; a file that is not JSON at all is a usage error.

    Raises:
        UserError: ``data`` is not JSON (exit 2), naming the file and the fix.
    """
    if len(data) > MAX_TRACE_BYTES:
        return _TooLarge()
    try:
        return json.loads(data)
    except RecursionError:
        return _TooDeep()
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a JSON document ({exc}); a trace is the single JSON "
                        "document `choir trace export RUN_ID -o FILE` writes") from None
    except ValueError:  # JSON, but a number longer than Python reads (4,300 digits)
        return _TooLong()


class _TooLarge:
    pass


class _TooDeep:
    pass


class _TooLong:
    pass


def verify_trace(raw: Any, store: ArtifactStore, *, partial: bool = False,
                 sources: RecordSources | None = None) -> TraceVerification:
    """Run every check on a parsed trace (``parse_trace_json``) against ``store``.

    ``partial``: the trace of a run still under way (the ``trace`` verifier kind): its end,
    its last plan's steps and its required verifiers are not demanded yet.
    ``sources``: the home to hold the trace against (``choir.trace.grounding``); without it
    only the structural checks run and are listed (``TRACE_CHECKS``): the CLI, ``choir
    audit`` and the ``trace`` verifier always give it.
    """
    names = CHECKS if sources is not None else TRACE_CHECKS
    fails, ran = _Failures(), set[str]()
    ran.add("version")
    if isinstance(raw, _TooLarge | _TooDeep | _TooLong):
        fails.add("schema", "$", "larger than the cap of 64 MiB" if isinstance(raw, _TooLarge)
                  else "nested too deeply to be a trace" if isinstance(raw, _TooDeep)
                  else "a number too long to be a trace's")
        ran.add("schema")
        return _report(fails, ran, {}, names)
    _check_versions(raw, fails)
    if fails.failed:
        return _report(fails, ran, {}, names)
    ran.add("schema")
    try:
        trace = Trace.model_validate(raw)
    except ValidationError as err:
        for e in err.errors()[:50]:
            fails.add("schema", "$." + ".".join(str(x) for x in e["loc"]), e["msg"])
        return _report(fails, ran, {}, names)
    ran.update(names)
    _check_ordering(trace, fails)
    calls = _check_linkage(trace, fails)
    _check_required(trace, fails, partial)
    _check_markers(trace, fails)
    metrics = _check_evidence_and_citations(trace, store, fails)
    _check_insufficient(trace, fails)
    if sources is not None:
        check_grounding(trace, sources, fails.add)
    metrics.update(events=len(trace.events), tool_calls=calls, claims=len(trace.claims),
                   citations=sum(len(c.citations) for c in trace.claims),
                   insufficient_claims=sum(c.insufficient for c in trace.claims))
    return _report(fails, ran, metrics, names)


def verify_trace_file(path: Path, store: ArtifactStore, *,
                      sources: RecordSources | None = None) -> TraceVerification:
    """Read, parse and verify a trace file (against the home of ``sources`` when given).

    Raises:
        UserError: the file is missing, unreadable or not JSON (exit 2).
    """
    return verify_trace(parse_trace_json(read_trace_file(path), path), store, sources=sources)


def _check_versions(raw: Any, fails: _Failures) -> None:
    if not isinstance(raw, dict):
        fails.add("version", "$", "a trace is a JSON object with schema_version first")
        return
    version = raw.get("schema_version")
    if type(version) is not int or version not in SUPPORTED_TRACE_VERSIONS:
        fails.add("version", "$.schema_version",
                  f"trace schema version {version!r} is not supported "
                  f"(supported: {sorted(SUPPORTED_TRACE_VERSIONS)})")
    plan = raw.get("plan")
    plan_version = plan.get("schema_version") if isinstance(plan, dict) else None
    if type(plan_version) is not int or plan_version not in SUPPORTED_PLAN_VERSIONS:
        fails.add("version", "$.plan.schema_version",
                  f"plan schema version {plan_version!r} is not supported "
                  f"(supported: {sorted(SUPPORTED_PLAN_VERSIONS)})")


def _check_ordering(trace: Trace, fails: _Failures) -> None:
    previous = None
    for n, ev in enumerate(trace.events):
        if ev.seq != n + 1:
            fails.add("ordering", f"events[{n}]", f"seq {ev.seq} where {n + 1} comes next")
        if ev.ts.tzinfo is None:
            fails.add("ordering", f"events[{n}]", "a timestamp without a time zone")
        elif previous is not None and previous.tzinfo is not None and ev.ts < previous:
            fails.add("ordering", f"events[{n}]", f"ts {ev.ts.isoformat()} is before the "
                                                  f"previous event's {previous.isoformat()}")
        previous = ev.ts
    for n, claim in enumerate(trace.claims):
        if not 1 <= claim.event_seq <= len(trace.events):
            fails.add("ordering", f"claims[{n}]",
                      f"event_seq {claim.event_seq} names no event of this trace")


def _check_linkage(trace: Trace, fails: _Failures) -> int:
    calls: dict[str, tuple[int, str]] = {}
    answered: set[str] = set()
    for n, ev in enumerate(trace.events):
        if ev.kind not in ("tool_call", "tool_result"):
            if ev.call_id is not None:
                fails.add("tool_linkage", f"events[{n}]", f"a {ev.kind} event carries call "
                                                          f"id {ev.call_id!r}")
            continue
        if ev.call_id is None:
            fails.add("tool_linkage", f"events[{n}]", f"a {ev.kind} without a call_id")
            continue
        if ev.kind == "tool_call":
            if ev.call_id in calls:
                fails.add("tool_linkage", f"events[{n}]", f"call id {ev.call_id!r} is reused")
            calls[ev.call_id] = (n, ev.name)
        elif ev.call_id not in calls:
            fails.add("tool_linkage", f"events[{n}]",
                      f"result {ev.call_id!r} answers no earlier call")
        elif ev.call_id in answered:
            fails.add("tool_linkage", f"events[{n}]", f"call {ev.call_id!r} has two results")
        elif calls[ev.call_id][1] != ev.name:
            fails.add("tool_linkage", f"events[{n}]", f"result of {ev.name!r} answers the call "
                                                      f"of {calls[ev.call_id][1]!r}")
            answered.add(ev.call_id)
        else:
            answered.add(ev.call_id)
    for call_id, (n, _) in calls.items():
        if call_id not in answered:
            fails.add("tool_linkage", f"events[{n}]", f"call {call_id!r} has no result")
    return len(calls)


def _check_required(trace: Trace, fails: _Failures, partial: bool) -> None:
    kinds = [ev.kind for ev in trace.events]
    if not kinds or kinds[0] != "run_started":
        fails.add("required_steps", "events[0]", "the trace does not begin with run_started")
    if not partial and (not kinds or kinds[-1] not in ("run_ended", "awaiting_approval")):
        fails.add("required_steps", "events[-1]", "the trace does not end with run_ended: "
                  f"a crashed run (`choir run --resume {trace.run_id}`) or a truncated trace")
    # a step is present when it was called; whether the call has its result is tool_linkage
    ran: set[tuple[int, str, int]] = set()
    called: set[str] = set()
    for ev in trace.events:
        plan, replica = ev.data.get("plan"), ev.data.get("replica") or 0
        if ev.kind == "tool_call" and type(plan) is int and type(replica) is int:
            ran.add((plan, ev.name, replica))
            called.add(ev.name)
    current = max((s.plan for s in trace.plan.planned), default=0) if partial else -1
    for n, step in enumerate(trace.plan.planned):
        if step.plan != current and (step.plan, step.name, step.replica) not in ran:
            fails.add("required_steps", f"plan.planned[{n}]",
                      f"planned step {step.name}#{step.replica} of plan {step.plan} was "
                      "never called")
    for name in () if partial else trace.plan.required:
        if name not in called:
            fails.add("required_steps", "plan.required",
                      f"required verifier {name!r} was never called")


def _check_markers(trace: Trace, fails: _Failures) -> None:
    for n, claim in enumerate(trace.claims):
        where = f"claims[{n}] ({claim.id})"
        if not claim.citations and not claim.insufficient:
            fails.add("citation_marker", where, "a derived claim without a citation")
        used: set[int] = set()
        for marker in _MARKER.finditer(claim.text):
            body = marker.group(1)
            if not (body.isascii() and body.isdigit()) or body.startswith("0"):
                fails.add("citation_marker", where, f"malformed marker {marker.group(0)!r}")
            elif int(body) > len(claim.citations):
                fails.add("citation_marker", where, f"marker {marker.group(0)} names no "
                                                    f"citation ({len(claim.citations)} given)")
            else:
                used.add(int(body))
        stray = claim.text.count("[@") - len(_MARKER.findall(claim.text))
        if stray:
            fails.add("citation_marker", where, "an unterminated or malformed [@ marker")
        for k in range(1, len(claim.citations) + 1):
            if k not in used:
                fails.add("citation_marker", where, f"citation {k} has no [@{k}] marker")


def _after_newlines(chunk: bytes, at: int, n: int) -> int:
    """The offset just past the ``n``-th newline of ``chunk`` counted from ``at``.

    The caller knows there are that many. Blocks holding fewer are skipped by a count (C
    speed); the block holding the target is halved down to a few finds, so a boundary costs
    bytes/4 KiB plus a few steps, never one Python step per line.
    """
    step = 1 << 12
    while n:
        if step <= 64:
            at = chunk.index(b"\n", at) + 1
            n -= 1
            continue
        found = chunk.count(b"\n", at, at + step)
        if found < n:
            n, at = n - found, at + step
        else:
            step //= 2
    return at


def _scan(store: ArtifactStore, digest: str,
          spans: list[tuple[int, int]]) -> tuple[str, int, int, dict[int, int]]:
    """One streaming pass: the file's blake3, its line count, its size, and the byte offset
    where each line a span starts or ends at begins (``lo`` and ``hi + 1``; a line past the
    end of the file has none). Spans are hashed afterwards by byte range (``_hash_ranges``),
    so the cost is the file's bytes plus the cited bytes, not lines x spans.

    Raises:
        IntegrityError: ``digest`` is missing or not a regular file.
    """
    bounds = sorted({lo for lo, _ in spans} | {hi + 1 for _, hi in spans})
    whole = blake3.blake3(max_threads=1)
    starts: dict[int, int] = {}
    k, newlines, size, last = 0, 0, 0, b"\n"
    with store.open(digest) as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            whole.update(chunk)
            count = chunk.count(b"\n")
            at, seen = 0, newlines  # line seen + 1 starts at size + at
            while k < len(bounds) and bounds[k] - 1 <= newlines + count:
                at = _after_newlines(chunk, at, bounds[k] - 1 - seen)
                seen = bounds[k] - 1
                starts[bounds[k]] = size + at
                k += 1
            newlines, size, last = newlines + count, size + len(chunk), chunk[-1:]
    return whole.hexdigest(), newlines + (last != b"\n"), size, starts


def _hash_ranges(store: ArtifactStore, digest: str,
                 ranges: dict[tuple[int, int], tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The blake3 of each byte range ``[start, end)`` of a stored file, read by seeking."""
    hashes: dict[tuple[int, int], str] = {}
    with store.open(digest) as fh:
        for span, (start, end) in sorted(ranges.items(), key=lambda item: item[1]):
            hasher = blake3.blake3(max_threads=1)
            fh.seek(start)
            while start < end:
                piece = fh.read(min(end - start, _CHUNK))
                if not piece:
                    break
                hasher.update(piece)
                start += len(piece)
            hashes[span] = hasher.hexdigest()
    return hashes


def _cited_spans(trace: Trace, fails: _Failures
                 ) -> dict[str, list[tuple[str, TraceCitation]]]:
    """Each listed artifact's well-formed citations; an artifact cited by more distinct spans
    than ``MAX_SPANS_PER_ARTIFACT`` fails ``citation_span`` once and none of them is hashed."""
    listed = {e.hash for e in trace.evidence}
    cited: dict[str, list[tuple[str, TraceCitation]]] = defaultdict(list)
    for n, claim in enumerate(trace.claims):
        for k, cite in enumerate(claim.citations):
            where = f"claims[{n}].citations[{k}]"
            if cite.line_start < 1 or cite.line_end < cite.line_start:
                fails.add("citation_span", where,
                          f"lines {cite.line_start}-{cite.line_end} are not a span")
                continue
            if cite.artifact not in listed:
                fails.add("evidence_integrity", where,
                          f"cites {cite.artifact}, which is not among the evidence files")
                continue
            cited[cite.artifact].append((where, cite))
    for digest, cites in list(cited.items()):
        distinct = len({(c.line_start, c.line_end) for _, c in cites})
        if distinct > MAX_SPANS_PER_ARTIFACT:
            fails.add("citation_span", cites[0][0],
                      f"{digest} is cited by {distinct} distinct spans, more than the "
                      f"{MAX_SPANS_PER_ARTIFACT} distinct spans checked per evidence file; "
                      "cite fewer, wider spans (none of them was checked)")
            del cited[digest]
    return cited


def _span_ranges(cited: dict[str, list[tuple[str, TraceCitation]]],
                 scans: dict[str, tuple[str, int, int, dict[int, int]] | Exception],
                 fails: _Failures) -> tuple[dict[str, dict[tuple[int, int], tuple[int, int]]],
                                            dict[tuple[str, int, int], str]]:
    """The byte range of every cited span to hash, and the hashes known without hashing (a
    span of the whole file hashes to the file's digest). Past ``MAX_CITED_BYTES`` of ranges
    in all, ``citation_span`` fails and no range is hashed."""
    ranges: dict[str, dict[tuple[int, int], tuple[int, int]]] = defaultdict(dict)
    known: dict[tuple[str, int, int], str] = {}
    total = 0
    for digest, cites in cited.items():
        got = scans.get(digest)
        if got is None or isinstance(got, Exception):
            continue
        whole, lines, size, starts = got
        for _, cite in cites:
            lo, hi = cite.line_start, cite.line_end
            if hi > lines or (lo, hi) in ranges[digest] or (digest, lo, hi) in known:
                continue
            start, end = starts[lo], starts.get(hi + 1, size)
            if start == 0 and end == size:
                known[(digest, lo, hi)] = whole
            else:
                ranges[digest][(lo, hi)] = (start, end)
                total += end - start
    if total > MAX_CITED_BYTES:
        fails.add("citation_span", "claims",
                  f"the citations' spans cover {total} cited bytes, more than the cap of "
                  f"{MAX_CITED_BYTES} (whole files do not count); cite fewer or shorter "
                  "spans (none of them was checked)")
        return {}, known
    return ranges, known


def _check_evidence_and_citations(trace: Trace, store: ArtifactStore,
                                  fails: _Failures) -> dict[str, int]:
    cited = _cited_spans(trace, fails)

    def scan(digest: str) -> tuple[str, int, int, dict[int, int]] | Exception:
        spans = list({(c.line_start, c.line_end) for _, c in cited.get(digest, [])})
        try:
            return _scan(store, digest, spans)
        except Exception as exc:  # noqa: BLE001 - unreadable evidence is missing evidence
            return exc

    unique = list(dict.fromkeys(e.hash for e in trace.evidence))
    with ThreadPoolExecutor(max_workers=4) as pool:  # file reads and hashing leave the GIL
        scans = dict(zip(unique, pool.map(scan, unique), strict=True))
        ranges, span_hashes = _span_ranges(cited, scans, fails)

        def hash_ranges(digest: str) -> dict[tuple[int, int], str] | Exception:
            try:
                return _hash_ranges(store, digest, ranges[digest])
            except Exception as exc:  # noqa: BLE001 - as unreadable as in the scan
                return exc

        todo = [digest for digest, spans in ranges.items() if spans]
        for digest, hashed in zip(todo, pool.map(hash_ranges, todo), strict=True):
            if isinstance(hashed, Exception):
                fails.add("evidence_integrity", f"evidence {digest}",
                          f"its cited spans could not be read back: {hashed}")
            else:
                span_hashes.update({(digest, *span): h for span, h in hashed.items()})
    seen: set[str] = set()
    scanned = 0
    for n, ev in enumerate(trace.evidence):
        where = f"evidence[{n}] ({ev.name or ev.role})"
        if ev.hash in seen:
            fails.add("evidence_integrity", where, f"{ev.hash} is listed twice")
            continue
        seen.add(ev.hash)
        got = scans[ev.hash]
        if isinstance(got, Exception):
            fails.add("evidence_integrity", where, f"not in the store as it was: {got}")
            continue
        digest, lines, _, _ = got
        scanned += 1
        if digest != ev.hash:
            fails.add("evidence_integrity", where, f"the stored bytes hash to {digest}")
        for cwhere, cite in cited.get(ev.hash, []):
            span = span_hashes.get((ev.hash, cite.line_start, cite.line_end))
            if cite.line_end > lines:
                fails.add("citation_span", cwhere, f"lines {cite.line_start}-{cite.line_end} "
                                                   f"of a file of {lines} lines")
            elif span is not None and span != cite.span_hash:  # None: failed above
                fails.add("citation_hash", cwhere, f"lines {cite.line_start}-{cite.line_end} "
                          f"hash to {span}, not {cite.span_hash}")
    return {"evidence_files": len(trace.evidence), "evidence_verified": scanned}


def _check_insufficient(trace: Trace, fails: _Failures) -> None:
    # the output of the run's last stretch counts: a resumed run may still find its evidence
    resumed = max((n for n, ev in enumerate(trace.events) if ev.kind == "run_resumed"),
                  default=-1)
    emitted = [n for n, ev in enumerate(trace.events)
               if ev.kind == "insufficient_evidence" and n > resumed]
    declared = trace.outcome.insufficient_evidence is not None
    if bool(emitted) != declared:
        fails.add("insufficient_evidence", "outcome.insufficient_evidence",
                  "the outcome and the events disagree on whether evidence was insufficient")
    if not (emitted or declared):
        return
    for n, claim in enumerate(trace.claims):
        if not claim.insufficient:
            fails.add("insufficient_evidence", f"claims[{n}] ({claim.id})",
                      "the run emitted insufficient evidence, yet this claim is not marked "
                      "insufficient")
