"""The tools: ``verify``, ``show_report``, ``show_attestation``, ``gate``, ``list_runs``.

Each is the command a person would run, through the same code (``choir.app.verify``,
``choir.app.gate``, the viewer's read-only stores), with its answer cut to what the executor
of ``choir run`` may hear (``choir.mcp.bound``). Every choice a person makes when starting the
server (which repos, which sandbox, how long a verification may take, ``CHOIR_HOME``) stays
here, out of every tool's arguments.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from choir._core.paths import choir_home
from choir.evidence.artifacts import ArtifactStore
from choir.evidence.heldout import counts_only, is_heldout
from choir.exceptions import UserError
from choir.executors.prompt import MAX_FEEDBACK_REPORTS
from choir.mcp.args import GateArgs, ListRunsArgs, ShowArgs, VerifyArgs
from choir.mcp.bound import clean, fit
from choir.mcp.scope import Scope, Served
from choir.models import Attestation, Mood, VerificationReport
from choir.sandbox.stop import stop_steps
from choir.serve import client as service
from choir.serve.client import Call
from choir.trusted.confine import origin_fd
from choir.view.index import RunIndex
from choir.view.reads import Stores, attestation_view, load_report

VERIFY_TIMEOUT_S = 900.0
FAILING_MAX = 20  # failing tests named in one answer (each with file:line and an excerpt)
VIOLATIONS_MAX = 10
STOP_EVERY_S = 0.2
EXIT_USAGE = 2  # `choir verify`'s exit code for a configuration error
SAID_MAX = 64 << 10  # what a worker's stderr may hold that an answer reads


@dataclass
class Tools:
    """The state one server keeps: its scope and launch choices, a lock that runs one
    verification at a time (they compete with the agent for the same cores), the run
    index."""

    scope: Scope
    sandbox: str | None = None
    timeout_s: float = VERIFY_TIMEOUT_S
    _lock: anyio.Lock = field(default_factory=anyio.Lock)
    _index: RunIndex | None = None

    def _stores(self) -> Stores:
        return Stores(choir_home(), ArtifactStore())

    def _heldout(self, report: VerificationReport, att: Attestation | None) -> bool:
        """Held out by the attestation's own record, or by any served repo's pinned config."""
        return (att is not None and att.body.heldout is not None) or any(
            is_heldout(report, s.specs) for s in self.scope.repos)

    async def verify(self, args: VerifyArgs) -> dict[str, Any]:
        """``choir verify`` of a served repo, one at a time, within the bound (see
        ``_bounded``); a call waiting for another one gives up after the bound too."""
        served = self.scope.pick(args.repo)
        try:
            with anyio.fail_after(self.timeout_s):
                await self._lock.acquire()
        except TimeoutError:
            raise UserError(f"verify: another verification held the server for "
                            f"{self.timeout_s:g} s; try again") from None
        try:
            self.scope.check_pinned(served)
            contract, stopped = await self._bounded(served, args)
        finally:
            self._lock.release()
        self.scope.check_pinned(served)  # an edit while it ran: its answer is not the policy's
        answer = self._session(served, contract)
        if stopped:
            answer["stopped"] = (f"not done within {self.timeout_s:g} s (`choir mcp --timeout`): "
                                 "its sandboxes were stopped; the runs they cut are recorded "
                                 "and attested as they ended")
        return answer

    async def _bounded(self, served: Served, args: VerifyArgs) -> tuple[dict[str, Any], bool]:
        """Run the verification to its end, stopping its sandboxes past the bound.

        The steps run in worker threads, so cancelling the verification would only stop
        waiting for them: they would run on, then seal run folders nothing attests (which
        ``choir audit`` rightly reports). So the verification itself is never cancelled;
        past the bound, or when the client cancels the call, its sandboxes are killed
        (``choir.sandbox.stop``) until it concludes on what they did, like a step that timed
        out. A cancelled call still raises once the session is recorded.

        A running ``choir serve`` verifies when there is one (``choir.serve.client``): the
        same code in a warm worker, whose sandboxes it stops when asked.
        """
        from choir.app.verify import averify_tree

        found: dict[str, Any] = {}
        done = anyio.Event()
        # a claim opens the gate: verified with the checks of the commit the server started
        # on, as a pull request against its base, never with the agent's own edits of the
        # tests, conftest.py or a verifier's module (review 16f: a planted conftest.py that
        # marks every report passed was ASSERTed in PARANOID)
        base = served.head if args.claim else None
        if args.claim and base is None:
            raise UserError(f"claim {args.claim!r}: a claim is verified with the checks of "
                            f"the commit the server started on, and {served.root} had none: "
                            "it had no commit, or it is not the root of a git work tree (a "
                            "project in a subfolder)\n  fix: commit and restart `choir mcp`, "
                            "serve the work tree's root, or verify without a claim for "
                            "feedback")
        # the pinned bytes or nothing: the worker and this process alike refuse an edited
        # choir.yaml before anything runs or a claim is recorded
        line = ["verify", "--repo", str(served.root), "--json",
                "--pinned-config", served.config_hash]
        for flag, value in (("--mood", args.mood), ("--sandbox", self.sandbox),
                            ("--claim", args.claim), ("--base", base)):
            line += [flag, value] if value else []
        call, files = await anyio.to_thread.run_sync(_service_call, {"argv": line})
        stop: Callable[[], object] = call.stop if call is not None else stop_steps

        async def run() -> None:
            with anyio.CancelScope(shield=True):
                try:
                    if call is not None:
                        found["contract"] = await anyio.to_thread.run_sync(
                            _service_answer, call, files)
                    else:
                        found["contract"] = (await averify_tree(
                            served.root, mood=Mood(args.mood), sandbox_name=self.sandbox,
                            claim=args.claim, pinned=served.config_hash,
                            base=base)).contract
                except Exception as exc:  # handed to the caller below
                    found["error"] = exc
                finally:
                    done.set()

        stopped = False
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            try:
                with anyio.move_on_after(self.timeout_s):
                    await done.wait()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await _stop_until(done, stop)
                raise
            if not done.is_set():
                stopped = True
                await _stop_until(done, stop)
        if "error" in found:
            raise found["error"]
        return found["contract"], stopped

    def _session(self, served: Served, contract: dict[str, Any]) -> dict[str, Any]:
        stores = self._stores()
        by_run: dict[str, Attestation] = {}
        for att_id in contract.get("attestations", []):
            minted = stores.attestations.get(att_id)
            by_run[minted.body.run_id] = minted
        reports: list[dict[str, Any]] = []
        hidden: set[str] = set()
        for data, thread in zip(contract["reports"], contract["threads"], strict=True):
            report = VerificationReport.model_validate(data)
            att = by_run.get(thread["run_id"])
            if self._heldout(report, att):
                hidden.add(report.verifier)
                report = counts_only(report)
            reports.append({"run_id": thread["run_id"], "replica": thread["replica"],
                            "attestation": att.id if att else None,
                            **report.model_dump(mode="json")})
        answer = {
            "status": contract["status"], "verdict": contract["verdict"],
            "run_id": contract["run_id"], "repo": str(served.root), "mood": contract["mood"],
            "plan": contract["plan"], "plan_dropped": contract["plan_dropped"],
            "sandbox": {k: v for k, v in contract["manifest"]["platform"].items()
                        if k in ("sandbox", "isolation")},
            "summary": contract["summary"] if not hidden else "; ".join(
                f"{r['verifier']}: {r['result']}" for r in reports),
            "attestations": contract["attestations"],
            **_capped("failing_tests", [t for t in contract["failing_tests"]
                                        if t["verifier"] not in hidden], FAILING_MAX),
            # what did not pass first: that is what the agent has to act on
            **_capped("reports", sorted(reports, key=lambda r: r["result"] == "PASS"),
                      MAX_FEEDBACK_REPORTS),
        }
        if "claim" in contract:
            answer["claim"] = contract["claim"]
        return fit(clean(answer))

    def show_report(self, args: ShowArgs) -> dict[str, Any]:
        """The report an attestation signed, re-hashed now; a held-out one as counts only."""
        stores = self._stores()
        view = attestation_view(stores, args.id)
        if view.att is None:
            raise UserError(f"attestation {args.id[:12]}: unreadable: {view.error}")
        report, intact, error = load_report(stores, view.att.body.report_hash)
        if report is None:
            raise UserError(f"attestation {args.id[:12]}: its report is unreadable: {error}")
        if self._heldout(report, view.att):
            report = counts_only(report)
        return fit(clean({"attestation": args.id, "report_hash": view.att.body.report_hash,
                          "report_intact": intact, "attestation_valid": view.valid,
                          "report": report.model_dump(mode="json")}))

    def show_attestation(self, args: ShowArgs) -> dict[str, Any]:
        """An attestation and its status, re-derived now (id, signature, key trust, objects)."""
        view = attestation_view(self._stores(), args.id)
        answer: dict[str, Any] = {
            "id": args.id, "valid": view.valid, "signature_ok": view.signature_ok,
            "key_trusted": view.key_trusted, "objects_ok": view.objects_ok,
            "trust": view.trust_source, "error": view.error,
            "violations": [{"kind": v.kind, "expected": v.expected, "found": v.found}
                           for v in view.violations[:VIOLATIONS_MAX]],
        }
        if view.att is not None:
            body = view.att.body
            answer |= {"signer_key_id": view.att.signer_key_id, "verifier": body.verifier,
                       "verifier_kind": body.verifier_kind, "result": body.result.value,
                       "run_id": body.run_id, "report_hash": body.report_hash,
                       "manifest_hash": body.manifest_hash, "mood": body.mood,
                       "lens": body.lens, "heldout": body.heldout is not None,
                       "target": body.target.model_dump(mode="json", exclude={"files"}),
                       "sandbox": body.environment.sandbox,
                       "isolation": body.environment.isolation,
                       "started_at": body.started_at.isoformat(),
                       "ended_at": body.ended_at.isoformat()}
        return fit(clean(answer))

    def gate(self, args: GateArgs) -> dict[str, Any]:
        """``choir gate WORK_ITEM --repo SERVED [--commit SHA]``: the same answer."""
        from choir.ahdb.anchor import SeenHeads
        from choir.app.gate import check_gate, gate_target

        served = self.scope.pick(args.repo)
        tree, sha = gate_target(served.root, args.commit)
        marks = SeenHeads.default_path()
        answer = check_gate(args.work_item, tree=tree, commit=sha,
                            seen=SeenHeads(marks) if marks else None)
        return fit(clean({"passed": answer.passed, "work_item": answer.work_item,
                          "tree_hash": answer.tree_hash, "commit_sha": answer.commit_sha,
                          "signers": answer.signers, "trust": answer.trust,
                          "problems": answer.problems}), key="problems")

    def list_runs(self, args: ListRunsArgs) -> dict[str, Any]:
        """Runs under this home, newest first; with ``repo``, that served repo's ``choir
        verify`` sessions (a ``choir run``'s trace does not record its repo)."""
        store = ArtifactStore()
        if self._index is None:
            self._index = RunIndex(choir_home(), store.root)
        rows = self._index.rows()
        keep: Callable[[Any], bool] = lambda row: True  # noqa: E731
        if args.repo is not None:
            root = str(self.scope.pick(args.repo).root)
            keep = lambda row: row.kind == "verify" and _repo_of(store, row.run_id) == root  # noqa: E731
        runs: list[dict[str, Any]] = []
        for row in rows:
            if len(runs) >= args.limit:
                break
            if keep(row):
                runs.append({"run_id": row.run_id, "kind": row.kind, "status": row.status,
                             "work_item": row.work_item, "mood": row.mood,
                             "started": row.started, "updated": row.updated,
                             "tree_hash": row.tree_hash})
        return fit(clean({"runs": runs, "stored": len(rows)}), key="runs")


async def _stop_until(done: anyio.Event, stop: Callable[[], object]) -> None:
    """Kill the sandboxes, and every one a queued verifier starts next, until ``done``."""
    while not done.is_set():
        await anyio.to_thread.run_sync(stop)
        with anyio.move_on_after(STOP_EVERY_S):
            await done.wait()


def _service_call(request: dict[str, Any]) -> tuple[Call | None, Any]:
    """A running service's worker for ``request`` and the files it prints on (its stdout
    and stderr), or None (verify in this process).

    Raises:
        UserError: ``CHOIR_SERVE=require`` and no service took it.
    """
    import tempfile

    mode = service.mode()
    if mode == "off":
        return None, None
    # closed by _service_answer once the worker has printed, or below
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    with open(os.devnull, "rb") as null:
        call, why = service.Call.start(choir_home(), request,
                                       (null.fileno(), out.fileno(), err.fileno()),
                                       mounts=origin_fd())  # confined: where it started
    if call is None:
        out.close()
        err.close()
        if mode == "require":
            raise UserError(f"CHOIR_SERVE=require: {why}")
    return call, (out, err)


def _service_answer(call: Call, files: Any) -> dict[str, Any]:
    """The contract the worker printed (``choir verify --json``).

    Raises:
        UserError: the verification's configuration error, or the worker was lost.
        RuntimeError: the verification crashed in the worker (its traceback).
    """
    out, err = files
    try:
        try:
            code = call.wait()
        except service.Lost as exc:
            raise UserError(str(exc)) from None
        finally:
            call.close()
        out.seek(0)
        err.seek(0)
        printed, said = out.read(), err.read(SAID_MAX).decode(errors="replace")
    finally:
        out.close()
        err.close()
    if code == EXIT_USAGE:
        raise UserError(said.strip().removeprefix("choir: error: "))
    try:
        contract: dict[str, Any] = json.loads(printed)
    except ValueError:
        raise RuntimeError(f"verify exited {code} without its JSON: {said[-2000:]}") from None
    return contract


def _capped(key: str, items: list[Any], most: int) -> dict[str, Any]:
    """``{key: the first most items}``, and ``{key}_truncated`` when some were left out."""
    out: dict[str, Any] = {key: items[:most]}
    if len(items) > most:
        out[f"{key}_truncated"] = len(items) - most
    return out


def _repo_of(store: ArtifactStore, run_id: str) -> str | None:
    from choir.verification.session import read_session

    repo = (read_session(store.run_dir(run_id)) or {}).get("repo")
    return repo if isinstance(repo, str) else None


__all__ = ["VERIFY_TIMEOUT_S", "Tools"]
