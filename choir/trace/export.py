"""Building a run's trace from what it stored: its recorded events, then the stores.

The recorded events (``choir.trace.record``) say what happened and in which order; reports,
manifests, attestations and AHDB claims are read back from the artifact store, the
attestation store and the AHDB, so the trace states what the evidence holds, not what the
run remembered. Each claim cites the evidence it came from by line span and span hash. The
evidence of a verifier run is its report, its manifest (which hashes every file of its run
folder, so these are not listed one by one), its logs and any file a claim cites.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from choir._core.paths import choir_home
from choir.exceptions import UserError
from choir.models import AtomKind, RunManifest, VerificationReport
from choir.trace.chain import sealed_count
from choir.trace.model import (
    PLAN_SCHEMA_VERSION,
    TRACE_SCHEMA_VERSION,
    DerivedClaim,
    EvidenceFile,
    InsufficientEvidence,
    PlannedStep,
    Trace,
    TraceCitation,
    TraceEvent,
    TraceOutcome,
    TracePlan,
)
from choir.trace.record import read_trace, record_path
from choir.verification.seal import Seal

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore

MAX_STORED_JSON = 4 << 20


def _line_count(store: ArtifactStore, digest: str) -> int:
    """Lines in an artifact (a last line without a newline counts), streaming."""
    count, last = 0, b"\n"
    with store.open(digest) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


class _Builder:
    """Collects evidence and claims; one citation per artifact span, counted once."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        self.evidence: dict[str, EvidenceFile] = {}
        self.claims: list[DerivedClaim] = []
        self._lines: dict[str, int] = {}

    def add_evidence(self, digest: str, role: str, name: str = "") -> None:
        if digest and digest not in self.evidence:
            self.evidence[digest] = EvidenceFile(hash=digest, role=role,  # type: ignore[arg-type]
                                                 name=name[:300])

    def whole(self, digest: str) -> TraceCitation | None:
        """A citation of every line of ``digest`` (None for an empty file: no line to cite)."""
        if digest not in self._lines:
            self._lines[digest] = _line_count(self.store, digest)
        if not self._lines[digest]:
            return None
        n = self._lines[digest]
        return TraceCitation(artifact=digest, line_start=1, line_end=n,
                             span_hash=self.store.span_hash(digest, 1, n))

    def claim(self, claim_id: str, kind: str, text: str, seq: int,
              cites: list[TraceCitation | None]) -> None:
        found = tuple(dict.fromkeys(c for c in cites if c is not None))[:8]
        markers = "".join(f" [@{n}]" for n in range(1, len(found) + 1))
        text = text[:1900].replace("[@", "[ @")  # text from a log never reads as a marker
        self.claims.append(DerivedClaim(
            id=claim_id[:200], kind=kind, text=text + markers,  # type: ignore[arg-type]
            event_seq=seq, citations=found))


def _verifier_result(b: _Builder, ev: TraceEvent, reports: dict[str, str]) -> None:
    report_hash, manifest_hash = ev.data.get("report_hash"), ev.data.get("manifest_hash")
    if not isinstance(report_hash, str) or not isinstance(manifest_hash, str):
        return  # a crashed green thread: no evidence, so nothing to claim from it
    report = VerificationReport.model_validate_json(
        b.store.read_bytes(report_hash, limit=MAX_STORED_JSON))
    manifest = RunManifest.model_validate_json(
        b.store.read_bytes(manifest_hash, limit=MAX_STORED_JSON))
    # the manifest hashes every file of the run folder: listing them all too made a run whose
    # steps left 9,000 files each outgrow the trace format (review 20b); its logs are listed
    b.add_evidence(report_hash, "report", f"{ev.call_id}/report.json")
    b.add_evidence(manifest_hash, "manifest", f"{ev.call_id}/manifest.json")
    for rel, digest in sorted(manifest.files.items()):
        if rel.startswith("logs/"):
            b.add_evidence(digest, "log", f"{ev.call_id}/{rel}")
    reports[str(ev.call_id)] = report_hash
    log = manifest.files.get("logs/combined.log")
    b.claim(f"{ev.call_id}/summary", "report_summary",
            report.summary, ev.seq,
            [b.whole(report_hash), b.whole(log) if log else None])
    for n, sig in enumerate(report.failure_signatures):
        cite = sig.citation
        own = TraceCitation(artifact=cite.artifact, line_start=cite.line_start,
                            line_end=cite.line_end, span_hash=cite.span_hash) if cite else None
        if cite is not None:
            b.add_evidence(cite.artifact, "log", f"{ev.call_id}/cited")
        what = " ".join(x for x in (sig.kind, sig.test_id or "", sig.location or "") if x)
        b.claim(f"{ev.call_id}/signature/{n}", "failure_signature",
                f"{what}: {sig.excerpt}".strip(), ev.seq,
                [own or b.whole(report_hash)])


def _atom_claims(b: _Builder, atoms: list[Any], attested: dict[str, tuple[int, str]],
                 reports: dict[str, str], last_seq: int) -> None:
    """AHDB claims this run made: those backed by its attestations, and the ASSERTs on them."""
    ours: dict[str, Any] = {}
    for atom in atoms:
        if any(a in attested for a in atom.attestations) or \
                any(r in ours for r in atom.references):
            ours[atom.id] = atom
    for atom in ours.values():
        backing = [a for a in atom.attestations if a in attested]
        for ref in atom.references:
            backing += [a for a in ours[ref].attestations if a in attested] if ref in ours \
                else []
        backing = list(dict.fromkeys(backing))
        seq = max((attested[a][0] for a in backing), default=last_seq)
        cites = [b.whole(reports[attested[a][1]]) for a in backing
                 if attested[a][1] in reports]
        text = atom.claim if atom.kind is not AtomKind.HYPOTHESIZE else \
            f"{atom.claim}; discriminating test: {atom.discriminating_test or '-'}"
        b.claim(f"ahdb/{atom.id}", atom.kind.value, f"{atom.status.value}: {text}", seq, cites)


def export_run(run_id: str, *, home: Path | None = None,
               store: ArtifactStore | None = None, sealed_only: bool = False) -> Trace:
    """The trace of ``choir run`` ``run_id``, built from its records and the stores.

    ``sealed_only``: the events up to the run's last seal, for a verifier reading the trace
    from inside the run. Its other nodes keep writing: the recorder writes a node's events,
    then (a signature later) their seal, so a tail may be unsealed only because its seal is
    on its way. Every seal is kept, so one that names more events than the record holds
    still fails ``seal_integrity``; the whole record is checked by the audit.

    Raises:
        UserError: no trace was recorded for ``run_id``.
        IntegrityError: a record, report or manifest it needs is unreadable.
    """
    from choir.evidence.artifacts import ArtifactStore

    base = home or choir_home()
    path = record_path(run_id, base)
    if not (path.exists() or path.is_symlink()):  # a planted link or FIFO is read, and named
        raise UserError(f"no trace recorded for run {run_id!r} under {path.parent}; "
                        "`choir runs` lists the runs, and only `choir run` records traces")
    events, seals = read_trace(path)
    if sealed_only:
        events = events[:sealed_count(events, seals)]
    return build_run_trace(run_id, events, seals, home=base, store=store or ArtifactStore())


def build_run_trace(run_id: str, events: Sequence[TraceEvent], seals: Sequence[Seal], *,
                    home: Path, store: ArtifactStore) -> Trace:
    """The trace the events of run ``run_id`` and the stores of ``home`` make.

    ``choir trace verify`` calls this too, on an exported trace's own events, and holds
    every derived field (work item, plan, claims, evidence, outcome) against the result.

    Raises:
        IntegrityError: a report or manifest it needs is unreadable.
    """
    from choir.ahdb import open_ahdb

    b = _Builder(store)
    required: list[str] = []
    planned: list[PlannedStep] = []
    reports: dict[str, str] = {}  # verifier call id -> report hash
    attested: dict[str, tuple[int, str]] = {}  # attestation id -> (seq, call id)
    work_item: str | None = None
    status, reason, insufficient = "running", "", None
    for ev in events:
        if ev.kind == "run_started":
            work_item = str(ev.data.get("work_item") or "") or None
            required = [str(x) for x in ev.data.get("required") or ()]  # type: ignore[union-attr]
        elif ev.kind == "plan":
            names = ev.data.get("verifiers") or ()
            lenses = ev.data.get("lenses") or ()
            for entry, lens in zip(names, lenses, strict=False):  # type: ignore[arg-type]
                name, _, replica = str(entry).rpartition("#")
                planned.append(PlannedStep(plan=int(ev.data["plan"]),  # type: ignore[arg-type]
                                           name=name, replica=int(replica), lens=str(lens)))
        elif ev.kind == "tool_result" and ev.name == "executor":
            if isinstance(ev.data.get("output"), str):
                b.add_evidence(str(ev.data["output"]), "executor_output",
                               f"{ev.call_id}/output")
        elif ev.kind == "tool_result":
            _verifier_result(b, ev, reports)
        elif ev.kind == "attestation":
            attested[ev.name] = (ev.seq, str(ev.data.get("call")))
        elif ev.kind in ("decision", "run_ended", "awaiting_approval"):
            status = str(ev.data.get("status") or status)
            reason = str(ev.data.get("reason") or reason)
        elif ev.kind == "run_resumed":  # what an earlier stop said no longer holds
            insufficient = None
        elif ev.kind == "insufficient_evidence":
            insufficient = InsufficientEvidence(reason=str(ev.data.get("reason", "")))
    if attested and (home / "ahdb.sqlite").exists():
        atoms = open_ahdb(home).atoms(work_item=work_item)
        _atom_claims(b, atoms, attested, reports, events[-1].seq if events else 0)
    claims = b.claims
    if insufficient is not None:  # docs/trace.md: every claim of such a run is marked
        claims = [c.model_copy(update={"insufficient": True}) for c in claims]
    return Trace(schema_version=TRACE_SCHEMA_VERSION, run_id=run_id, source="run",
                 work_item=work_item,
                 plan=TracePlan(schema_version=PLAN_SCHEMA_VERSION, required=tuple(required),
                                planned=tuple(planned)),
                 events=tuple(events), seals=tuple(seals), claims=tuple(claims),
                 evidence=tuple(b.evidence.values()),
                 outcome=TraceOutcome(status=status, reason=reason[:2000],
                                      insufficient_evidence=insufficient))
