"""Re-deriving a report's citations: every pointer must land inside its artifact and hash right.

A citation is how a bounded report points at raw evidence without carrying it. A signed
report whose citations are never re-checked can point anywhere (lines 9000-9999 of a
ten-line log, a zero hash) and still look sound, so audit re-reads each cited span from the
store and compares, failing closed on anything it cannot read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from choir.models import Attestation, RunManifest, VerificationReport, Violation

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore

MAX_REPORT = 4 << 20


def _v(kind: str, obj: str, expected: str, found: str) -> Violation:
    return Violation(kind=kind, object=obj[:200], expected=expected[:200], found=found[:200])


def _manifest_files(att: Attestation, store: ArtifactStore) -> set[str]:
    """Digests of every file the run's manifest lists, when the manifest is intact.

    An attestation names a bounded selection of its run's files; the manifest it signs
    (by hash) lists them all, so a citation may point at any of those.
    """
    digest = att.body.manifest_hash
    if not store.verify(digest):
        return set()
    try:
        manifest = RunManifest.model_validate_json(store.read_bytes(digest, limit=MAX_REPORT))
    except (ValidationError, ValueError, OSError):
        return set()
    return set(manifest.files.values())


def check_citations(att: Attestation, store: ArtifactStore) -> list[Violation]:
    """Every citation of ``att``'s report that is out of bounds, mis-hashed or unreadable.

    The cited artifact must also be one the attestation vouches for, so a report cannot
    borrow a span from another run's output.
    """
    where = f"{att.id}/report"
    try:
        report = VerificationReport.model_validate_json(
            store.read_bytes(att.body.report_hash, limit=MAX_REPORT))
    except (ValidationError, ValueError, OSError) as err:
        return [_v("citation_unreadable", where, "a readable VerificationReport", str(err))]
    vouched = set(att.body.artifacts.values()) | _manifest_files(att, store)
    found: list[Violation] = []
    for n, sig in enumerate(report.failure_signatures):
        cite = sig.citation
        if cite is None:
            continue
        obj = f"{where}/signature {n} ({cite.artifact[:16]}:{cite.line_start}-{cite.line_end})"
        if cite.artifact not in vouched:
            found.append(_v("citation_artifact", obj, "an artifact of this run", cite.artifact))
            continue
        try:
            last = store.read_lines(cite.artifact, cite.line_end, cite.line_end)
            if not last:
                found.append(_v("citation_bounds", obj, f"at least {cite.line_end} lines",
                                "fewer lines"))
                continue
            got = store.span_hash(cite.artifact, cite.line_start, cite.line_end)
        except Exception as exc:  # fail closed: an unreadable span is a violation
            found.append(_v("citation_unreadable", obj, "a readable span", str(exc)))
            continue
        if got != cite.span_hash:
            found.append(_v("citation_hash", obj, got, cite.span_hash))
    return found
