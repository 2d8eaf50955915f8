"""The mutation lens: do the pinned tests test the change at all?

A test suite that passes proves little if it would pass whatever the changed lines said. So
in BOLD and PARANOID a ``choir run`` checks the executor's change the other way round: each
line it changed (the candidate tree against the base tree pinned when the run started,
Python files outside the spec) is mutated by simple, deterministic operator swaps (``+`` and
``-``, ``==`` and ``!=``, ``<`` and ``<=``, ``and`` and ``or``, ``True`` and ``False``, an
integer ``n`` to ``n + 1``, ``return x`` to ``return None``), at most the mood's ``mutants``,
and the pinned tests run on each mutant in the sandbox, on a private copy of the sealed tree
the verifiers read (never the live tree). A mutant the tests fail on is killed; one they pass
on survived: a changed line no test depends on. Survivors make the check FAIL or
INCONCLUSIVE (the mood's ``mutation_survivors``), with each survivor named by file, line and
swap, so the person (and the executor: these are its own lines) sees it.

The check's evidence is the mutants' own sealed runs, each attested (lens ``mutant``, its
target the mutant's tree, never the candidate's): the check's manifest lists one command per
mutant with that run's outcome, and its report names each mutant run's manifest.
"""

from __future__ import annotations

import asyncio
import difflib
import io
import json
import os
import platform
import re
import secrets
import shutil
import time
import tokenize
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from choir._core.canonical import canonical_json
from choir.evidence.spec import load_manifest, matcher
from choir.evidence.tree import inspect_tree, remove_snapshot, snapshot_root
from choir.models import (
    CommandRecord,
    Counts,
    Platform,
    Result,
    RunManifest,
    Target,
    VerificationReport,
    VerifierRun,
)

if TYPE_CHECKING:
    from choir.director.rounds import Round
    from choir.models import PlannedVerifier, VerifierSpec
    from choir.verification.pipeline import PipelineResult

_SWAPS = {"+": "-", "-": "+", "*": "/", "/": "*", "==": "!=", "!=": "==", "<": "<=",
          "<=": "<", ">": ">=", ">=": ">", "and": "or", "or": "and", "True": "False",
          "False": "True", "is": "is not", "in": "not in"}
_RETURN = re.compile(r"^(\s*)return\s+(?!None\s*(#.*)?$)(\S.*)$")
MAX_FILE = 256 << 10  # bytes: a larger changed file is not mutated (reported)
LOG = "logs/mutation.log"


@dataclass(frozen=True)
class Mutant:
    """One swap on one changed line: ``path`` relative to the tree, ``line`` 1-based."""

    path: str
    line: int
    before: str
    after: str
    source: str  # the whole mutated file

    def label(self) -> str:
        return f"{self.path}:{self.line} {self.before!r} -> {self.after!r}"


def changed_lines(old: str, new: str) -> list[int]:
    """The 1-based lines of ``new`` that are not in ``old`` (replaced or inserted)."""
    out: list[int] = []
    matcher_ = difflib.SequenceMatcher(a=old.splitlines(), b=new.splitlines(), autojunk=False)
    for tag, _i1, _i2, j1, j2 in matcher_.get_opcodes():
        if tag in ("replace", "insert"):
            out.extend(range(j1 + 1, j2 + 1))
    return out


def _line_mutants(source: str, line: int) -> Iterator[tuple[str, str, str]]:
    """(before, after, mutated source) for ``line``: operator and constant swaps found by the
    tokenizer (never inside a string or a comment), then ``return x`` -> ``return None``."""
    lines = source.splitlines(keepends=True)
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.start[0] == line and t.end[0] == line]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return
    text = lines[line - 1]
    for tok in tokens:
        if tok.type in (tokenize.OP, tokenize.NAME) and tok.string in _SWAPS:
            after = _SWAPS[tok.string]
        elif tok.type == tokenize.NUMBER and tok.string.isdigit():
            after = str(int(tok.string) + 1)
        else:
            continue
        col0, col1 = tok.start[1], tok.end[1]
        mutated = text[:col0] + after + text[col1:]
        yield tok.string, after, "".join([*lines[:line - 1], mutated, *lines[line:]])
    found = _RETURN.match(text.rstrip("\n"))
    if found:
        mutated = f"{found.group(1)}return None\n"
        yield f"return {found.group(3)}"[:80], "return None", "".join(
            [*lines[:line - 1], mutated, *lines[line:]])


def mutants(tree: Path, base: dict[str, str], read_base: Callable[[str], str],
            is_spec: Callable[[str], bool], limit: int) -> tuple[list[Mutant], int]:
    """At most ``limit`` mutants of the changed lines of ``tree``'s Python files (outside the
    spec), spread over the lines (one swap per line first, round robin), in path order; and
    how many candidate swaps there were in all."""
    per_line: list[list[Mutant]] = []
    for dirpath, dirs, names in os.walk(tree):
        dirs.sort()
        for name in sorted(names):
            path = Path(dirpath) / name
            rel = path.relative_to(tree).as_posix()
            if not name.endswith(".py") or is_spec(rel) or path.is_symlink():
                continue
            if path.stat().st_size > MAX_FILE:
                continue
            new = path.read_text(encoding="utf-8", errors="replace")
            old = read_base(rel) if rel in base else ""
            for line in changed_lines(old, new):
                found = [Mutant(rel, line, b, a, src) for b, a, src in _line_mutants(new, line)]
                if found:
                    per_line.append(found)
    total = sum(len(x) for x in per_line)
    chosen: list[Mutant] = []
    depth = 0
    while len(chosen) < limit and any(depth < len(x) for x in per_line):
        chosen += [x[depth] for x in per_line if depth < len(x)][:limit - len(chosen)]
        depth += 1
    return chosen, total


def mutant_tree(tree: Path, mutant: Mutant, root: Path) -> Path:
    """A private, read-only copy of ``tree`` with ``mutant`` applied; the caller removes it."""
    copy = root / f".mutant-{os.getpid()}-{secrets.token_hex(6)}"
    try:
        shutil.copytree(tree, copy, symlinks=True)
        target = copy / mutant.path
        os.chmod(target.parent, 0o755)
        target.unlink()
        target.write_text(mutant.source, encoding="utf-8")
        for dirpath, _dirs, names in os.walk(copy, topdown=False):
            for name in names:
                p = Path(dirpath) / name
                if not p.is_symlink():
                    os.chmod(p, 0o444 | (p.stat().st_mode & 0o111))
            os.chmod(dirpath, 0o555)
    except BaseException:
        remove_snapshot(copy)
        raise
    return copy


def verdict(killed: int, survived: list[str], unknown: int, policy: str) -> Result:
    """PASS when every mutant was killed; survivors: the policy's FAIL or INCONCLUSIVE;
    mutants whose runs were inconclusive, none surviving: INCONCLUSIVE."""
    if survived:
        return Result.FAIL if policy == "fail" else Result.INCONCLUSIVE
    if unknown:
        return Result.INCONCLUSIVE
    return Result.PASS


RunOne = Callable[["VerifierSpec", "PlannedVerifier", str, Path, Target],
                  Awaitable[tuple[VerifierRun, "PipelineResult | None"]]]


async def run_mutation(rnd: Round, spec: VerifierSpec, planned: PlannedVerifier, run_id: str,
                       sandbox_name: str, run_one: RunOne) -> VerifierRun:
    """The mutation check of ``rnd``'s tree: every mutant through ``spec``'s steps
    (``run_one``: the round's sandboxed runner, on a tree and target of its own); one sealed
    run whose report counts the killed and names the survivors. A replay after a crash
    reads the sealed outcome back, never mutates again."""
    store = rnd.store
    sealed = store.sealed(run_id)
    if sealed is None:
        outcome, manifest_hash = await _mutate(rnd, spec, planned, run_id, sandbox_name,
                                               run_one)
    else:
        manifest_hash = sealed[1]
        outcome = json.loads(store.read_bytes(sealed[0].files["mutation.json"]))
    report = _report(rnd, planned, outcome)
    return VerifierRun(verifier=planned.name, run_id=run_id, report=report,
                       report_hash=store.ingest_bytes(canonical_json(report)),
                       manifest_hash=manifest_hash, lens=planned.lens,
                       replica=planned.replica, diagnostic=planned.diagnostic,
                       tests=planned.tests)


async def _mutate(rnd: Round, spec: VerifierSpec, planned: PlannedVerifier, run_id: str,
                  sandbox_name: str, run_one: RunOne) -> tuple[dict[str, Any], str]:
    mood = rnd.policy.moods[rnd.mood]
    store = rnd.store
    started, clock = datetime.now(UTC), time.monotonic()
    if rnd.base is None:
        raise RuntimeError("no base tree was pinned for this run: nothing to mutate against")
    base = load_manifest(store, rnd.base)

    def read_base(rel: str) -> str:
        return store.read_bytes(base.files[rel][1]).decode("utf-8", "replace")

    found, total = await asyncio.to_thread(
        mutants, rnd.tree, {p: v[1] for p, v in base.files.items() if v[0] != "l"},
        read_base, matcher(rnd.config.spec), mood.mutants)
    source = spec.model_copy(update={"kind": rnd.config.verifiers[spec.mutates or ""].kind})
    records: list[CommandRecord] = []
    lines: list[str] = []
    killed, unknown, survived = 0, 0, []
    evidence: dict[str, str] = {}
    isolation: Literal["container", "namespace", "none"] = "none"
    root = snapshot_root()
    for k, mutant in enumerate(found, start=1):
        tree = await asyncio.to_thread(mutant_tree, rnd.tree, mutant, root)
        try:
            mutant_target = Target(work_item=rnd.target.work_item,
                                   tree_hash=(await asyncio.to_thread(inspect_tree, tree)
                                              ).tree_hash)
            one = planned.model_copy(update={"diagnostic": True, "lens": "mutant"})
            run, result = await run_one(source, one, f"{run_id}-m{k}", tree, mutant_target)
        finally:
            await asyncio.to_thread(remove_snapshot, tree)
        outcome = run.report.result
        if result is not None:
            isolation = result.manifest.platform.isolation
        if outcome is Result.PASS:
            survived.append(mutant.label())
        elif outcome is Result.FAIL:
            killed += 1
        else:
            unknown += 1
        records.append(CommandRecord(name=f"mutant-{k}", command=f"{mutant.label()}: "
                                     + " && ".join(s.command for s in spec.steps),
                                     exit_code=0 if outcome is Result.PASS else 1,
                                     duration_ms=0))
        if len(evidence) < 15:
            evidence[f"mutant-{k}"] = run.manifest_hash
        lines.append(f"mutant {k} {mutant.label()}: {outcome.value} (tree "
                     f"{mutant_target.tree_hash[:12]}, manifest {run.manifest_hash[:12]})")
    outcome_ = {"mutants": [m.label() for m in found], "candidates": total,
                "survived": survived, "killed": killed, "inconclusive": unknown,
                "evidence": evidence, "policy": mood.mutation_survivors}
    folder = store.run_dir(run_id)
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    lines.insert(0, f"{len(found)} mutants of {total} candidate swaps on the changed lines; "
                    f"killed {killed}, survived {len(survived)}, inconclusive {unknown}")
    (folder / LOG).write_bytes(("\n".join(lines) + "\n").encode())
    (folder / "mutation.json").write_bytes(canonical_json(outcome_))
    files = store.seal_run(run_id)
    passed = verdict(killed, survived, unknown, mood.mutation_survivors) is Result.PASS
    manifest = RunManifest(
        run_id=run_id, verifier=planned.name, status="PASS" if passed else "FAIL",
        timestamp_start=started, timestamp_end=datetime.now(UTC),
        commit_sha=rnd.target.commit_sha, tree_hash=rnd.target.tree_hash,
        commands_executed=tuple(records) or (CommandRecord(
            name="mutants", command="no changed Python line to mutate", exit_code=0,
            duration_ms=int((time.monotonic() - clock) * 1000)),),
        platform=Platform(os=platform.system().lower(), arch=platform.machine(),
                          sandbox=sandbox_name, isolation=isolation),
        files=files)
    return outcome_, store.write_manifest(run_id, manifest)


def _report(rnd: Round, planned: PlannedVerifier, out: dict[str, Any]) -> VerificationReport:
    """The bounded report of a mutation check, from its sealed outcome."""
    found, survived = out["mutants"], out["survived"]
    killed, unknown = out["killed"], out["inconclusive"]
    result = verdict(killed, survived, unknown, out["policy"])
    if survived:
        summary = (f"{len(survived)} of {len(found)} mutants of the changed lines survived the "
                   f"pinned tests: {'; '.join(survived[:4])}")
    elif not found:
        summary = "no changed Python line outside the spec to mutate"
    else:
        summary = f"all {killed} mutants of the changed lines were killed" + (
            f"; {unknown} inconclusive" if unknown else "")
    return VerificationReport(
        verifier=planned.name, verifier_type="mutation", target=rnd.target, result=result,
        summary=summary[:480], confidence=1.0,
        counts=Counts(run=len(found), failed=len(survived), errors=unknown),
        artifacts=dict(out["evidence"]),
        next_actions=(("A changed line no pinned test depends on: test the change (a work "
                       "item may add tests with may_change_spec) or drop the line.",)
                      if survived else ("None: the pinned tests depend on every mutated "
                                        "line.",)))
