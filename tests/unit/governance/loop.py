"""Driving the real adjudicate node round after round, as the graph would, without sandboxes:
the verifier results are scripted, everything else (budget, splits, moods, AHDB writes) is
Choir's own code."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langgraph.types import Overwrite

from choir.attest import AttestationStore, load_signer
from choir.config import RepoConfig
from choir.config.policy import Policy, load_policy
from choir.evidence.artifacts import ArtifactStore
from choir.graph.adjudicate import adjudicate_node
from choir.graph.state import RunState, charge
from choir.models import Result, StepSpec, Target, VerifierKind, VerifierSpec, WorkItem
from choir.models.run import VerifierRun
from choir.sandbox import get_sandbox
from choir.verification import attest_run, run_verifier_thread
from tests.unit.director.test_director_adjudicate import repo_config, vrun

_minted: dict[tuple[str, str, str, str | None], str] = {}
_drives = 0


def mint(repo: Path, verifier: str, target: Target, command: str = "true") -> str:
    """A real, signed attestation of ``command`` run as ``verifier`` for ``target`` (a real
    process in the local sandbox): what the rules need to promote a PASS. One per target and
    verifier in a CHOIR_HOME (content-addressed evidence is reused, as a resumed run does)."""
    key = (str(repo), verifier, target.tree_hash, target.work_item)
    if key in _minted:
        return _minted[key]
    spec = VerifierSpec(name=verifier, kind=VerifierKind.UNIT_TESTS,
                        steps=(StepSpec(name="check", command=command),), timeout_s=30)
    store = ArtifactStore()
    run, _ = asyncio.run(run_verifier_thread(
        spec, repo=repo, target=target, sandbox=get_sandbox("local"), store=store,
        run_id=f"m{len(_minted)}-{verifier}"))
    _minted[key] = attest_run(run, spec, store=store, signer=load_signer(),
                              attestations=AttestationStore(), policy_hash=None,
                              mood="CALM").id
    return _minted[key]


# what the scripted verifiers say about one round: work item -> runs
Script = Callable[[WorkItem, int], list[VerifierRun]]


def setup(tmp_path: Path, **item: Any) -> tuple[RepoConfig, Policy, WorkItem]:
    config = repo_config(tmp_path / "repo")
    (tmp_path / "repo" / "calc.py").write_text("x = 1\n")
    fields = {"id": "wi", "goal": "make it work", "repo": str(tmp_path / "repo"),
              "required_verifiers": ("unit", "lint"), "max_attempts": 4, **item}
    return config, load_policy(config), WorkItem.model_validate(fields)


def merge(state: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if key in ("events", "usage"):
            state[key] = [*state.get(key, []), *value]
        elif isinstance(value, Overwrite):
            state[key] = list(value.value)
        else:
            state[key] = value


def drive(config: RepoConfig, policy: Policy, item: WorkItem, script: Script,
          max_rounds: int = 200) -> tuple[dict[str, Any], list[str]]:
    """Run the loop to its end; returns the final state and the executions (work item ids)."""
    global _drives
    _drives += 1
    state: dict[str, Any] = {"work_item": item, "config": config, "policy": policy,
                             "run_id": f"run-{_drives}", "mood": item.mood.value, "attempt": 0,
                             "round": 0, "history": [], "status": "running", "events": []}
    executed: list[str] = []
    goto = "execute"
    for _ in range(max_rounds):
        if goto == "execute":
            merge(state, charge(state))  # type: ignore[arg-type]
            state["attempt"] = state.get("attempt", 0) + 1
            state["nested"] = 0
            executed.append(state["work_item"].id)
            doing = state["work_item"]
            state["events"].append(f"execute {doing.id} attempt {state['attempt']} "
                                   f"(executor {doing.executor.kind})")
        elif goto != "direct":
            return state, executed
        state["target"] = Target(tree_hash=f"{len(executed):064x}",
                                 work_item=state["work_item"].id)
        runs = script(state["work_item"], state.get("round", 0))
        state["runs"] = [r.model_copy(update={"run_id": f"r{state.get('round', 0)}-{r.run_id}"})
                         for r in runs]
        # PASSes are attested for real when the round could promote (every run passed)
        state["attestations"] = {} if any(r.report.result is not Result.PASS for r in runs) \
            else {r.run_id: mint(Path(item.repo), r.verifier, state["target"])
                  for r in state["runs"]}
        command = asyncio.run(adjudicate_node(RunState(**state)))  # type: ignore[typeddict-item]
        merge(state, dict(command.update or {}))
        state.setdefault("moods", []).append(state["mood"])
        goto = str(command.goto)
    raise AssertionError("the loop did not end")


def fail(verifier: str, *tests: str, replica: int = 0) -> VerifierRun:
    return vrun(verifier, Result.FAIL, tests=tests, replica=replica)


def ok(verifier: str, replica: int = 0) -> VerifierRun:
    return vrun(verifier, Result.PASS, replica=replica)
