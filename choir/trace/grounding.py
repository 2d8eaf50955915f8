"""Holding a trace against the home it came from: seals, attestations, and what it derives.

The structural checks (``choir.trace.verify``) prove a trace well-formed and its citations
sound; they cannot tell a rewritten claim from a true one, because a trace carries its own
claims. These checks can, given the home's stores:

- ``seal_integrity`` / ``seal_coverage``: the events are exactly those the run sealed with a
  trusted key (``choir.trace.chain``), and every event is sealed;
- ``attestations``: every attestation event names a sound attestation in the store (id,
  signature, trusted key, objects) that agrees with the trace: the verifier call it attests,
  that call's result, report and manifest, the work item (or a part a split made of it,
  ``ITEM~N``), and the tree the executor left;
- ``derived``: the work item, plan, claims, evidence and outcome are what the sealed events
  and the stores derive (``choir.trace.export.build_run_trace``, the exporter's own code),
  so a claim whose text, status or citations were rewritten is named, field by field.

A durable Agent run's trace is built from the caller's context store, which nothing signs;
it may claim nothing but its output, so a run's trace relabelled ``agent`` fails here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from choir.trace.chain import check_seals
from choir.trace.model import Trace, TraceEvent

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Attestation

GROUNDING_CHECKS = ("seal_integrity", "seal_coverage", "attestations", "derived")
Add = Callable[[str, str, str], None]


@dataclass(frozen=True)
class RecordSources:
    """The stores of the home a trace is checked against.

    ``verified``: attestations the caller has already checked in full (``choir audit``), so
    they are not checked twice.
    """

    home: Path
    store: ArtifactStore
    trusted: Collection[str]
    verified: Mapping[str, Attestation] = field(default_factory=dict)

    @classmethod
    def of_home(cls, home: Path | None = None, store: ArtifactStore | None = None
                ) -> RecordSources:
        from choir._core.paths import choir_home
        from choir.attest import trusted_key_ids
        from choir.evidence.artifacts import ArtifactStore

        base = home or choir_home()
        return cls(home=base, store=store or ArtifactStore(), trusted=trusted_key_ids(base))


def check_grounding(trace: Trace, sources: RecordSources, add: Add) -> None:
    """Run the grounding checks on a validated trace; ``add(check, where, detail)``."""
    if trace.source == "agent":
        _agent_only(trace, add)
        return
    for check, where, detail in check_seals(trace.run_id, trace.events, trace.seals,
                                            sources.trusted):
        add(check, where, detail)
    _check_attestations(trace, sources, add)
    _check_derived(trace, sources, add)


def _agent_only(trace: Trace, add: Add) -> None:
    for n, claim in enumerate(trace.claims):
        if claim.kind != "output":
            add("derived", f"claims[{n}] ({claim.id})", f"an agent trace claims only its "
                f"output, not a {claim.kind}; only a sealed run trace can")
    for n, ev in enumerate(trace.evidence):
        if ev.role != "agent_context":
            add("derived", f"evidence[{n}]", f"an agent trace's evidence is its saved "
                f"context, not a {ev.role}")
    if trace.seals:
        add("derived", "seals", "an agent trace is not sealed; these seals belong to a run")


def _results(trace: Trace) -> tuple[dict[str, TraceEvent], dict[str, Any]]:
    """Each call's result event, and the tree the executor had left when each call began."""
    results: dict[str, TraceEvent] = {}
    trees: dict[str, Any] = {}
    tree = None
    for ev in trace.events:
        if ev.kind == "tool_result" and ev.call_id is not None:
            results.setdefault(ev.call_id, ev)
            if ev.name == "executor":
                tree = ev.data.get("tree_hash")
        elif ev.kind == "tool_call" and ev.call_id is not None:
            trees.setdefault(ev.call_id, tree)
    return results, trees


def _check_attestations(trace: Trace, sources: RecordSources, add: Add) -> None:
    from choir.attest import AttestationStore, verify_attestation
    from choir.exceptions import ChoirError

    atts = AttestationStore(sources.home / "attestations")
    results, trees = _results(trace)
    for n, ev in enumerate(trace.events):
        if ev.kind != "attestation":
            continue
        where = f"events[{n}] (attestation {ev.name[:16]})"
        att = sources.verified.get(ev.name)
        if att is None:
            try:
                att = atts.get(ev.name)
            except (ChoirError, OSError, ValueError) as exc:
                add("attestations", where, f"not in the attestation store as recorded: {exc}")
                continue
            for problem in verify_attestation(att, artifacts=sources.store,
                                              trusted_keys=sources.trusted):
                add("attestations", where, f"{problem.kind}: expected {problem.expected}, "
                                           f"found {problem.found}")
        body, call = att.body, ev.data.get("call")
        result = results.get(str(call))
        wants = [("the verifier call", call, body.run_id)]
        if result is not None:
            wants += [("the call's result", result.data.get("result"), body.result.value),
                      ("the call's report", result.data.get("report_hash"), body.report_hash),
                      ("the call's manifest", result.data.get("manifest_hash"),
                       body.manifest_hash),
                      ("the tree the executor left", trees.get(str(call)),
                       body.target.tree_hash)]
        item = body.target.work_item
        if item is not None and not _part_of(item, trace.work_item):
            wants.append(("the work item", trace.work_item, item))
        for what, traced, attested in wants:
            if traced is not None and traced != attested:
                add("attestations", where, f"{what}: the trace says {str(traced)[:80]!r}, "
                                           f"the attestation {str(attested)[:80]!r}")


def _part_of(item: str, run_item: str | None) -> bool:
    """``item`` is the run's work item or one of the parts a split made of it (``ITEM~N``)."""
    return run_item is not None and (item == run_item or item.startswith(f"{run_item}~"))


def _source(claim_id: str) -> str:
    if claim_id.startswith("ahdb/"):
        return f"AHDB atom {claim_id.removeprefix('ahdb/')[:16]}"
    return f"the stored report of {claim_id.rpartition('/')[0].rpartition('/')[0] or claim_id}"


def _check_derived(trace: Trace, sources: RecordSources, add: Add) -> None:
    from choir.trace.export import build_run_trace

    try:
        want = build_run_trace(trace.run_id, trace.events, trace.seals, home=sources.home,
                               store=sources.store)
    except Exception as exc:  # noqa: BLE001 - evidence the stores cannot give is missing
        add("derived", "$", f"the stores cannot derive this trace: {str(exc)[:300]}")
        return
    for name in ("work_item", "plan", "outcome"):
        got, expected = getattr(trace, name), getattr(want, name)
        if got != expected:
            add("derived", f"$.{name}", f"the trace says {_short(got)}, the sealed events "
                                        f"and the stores {_short(expected)}")
    derived = {c.id: c for c in want.claims}
    for n, claim in enumerate(trace.claims):
        where = f"claims[{n}] ({claim.id})"
        expected_claim = derived.pop(claim.id, None)
        if expected_claim is None:
            add("derived", where, "no such claim derives from the sealed events and stores")
            continue
        for name in ("kind", "text", "event_seq", "citations", "insufficient"):
            got, expected = getattr(claim, name), getattr(expected_claim, name)
            if got != expected:
                add("derived", where, f"{name}: the trace says {_short(got)}, "
                                      f"{_source(claim.id)} {_short(expected)}")
    for claim_id in derived:
        add("derived", f"claims ({claim_id})", f"a claim {_source(claim_id)} makes is missing")
    if set(trace.evidence) != set(want.evidence):
        extra = sorted(e.hash[:16] for e in set(trace.evidence) - set(want.evidence))
        missing = sorted(e.hash[:16] for e in set(want.evidence) - set(trace.evidence))
        add("derived", "$.evidence", f"evidence not derived: {extra[:5]}; derived but not "
                                     f"listed: {missing[:5]}")


def _short(value: Any) -> str:
    text = value.model_dump_json() if hasattr(value, "model_dump_json") else repr(value)
    return text if len(text) <= 160 else text[:157] + "..."
