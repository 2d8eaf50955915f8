"""The mutation lens: do the pinned tests test the change at all?

A test suite that passes proves little if it would pass whatever the changed lines said. So
in BOLD and PARANOID a ``choir run`` checks the executor's change the other way round: each
line it changed (the candidate tree against the base tree pinned when the run started,
Python files outside the spec) is mutated by simple, deterministic operator swaps (``+`` and
``-``, ``==`` and ``!=``, ``<`` and ``<=``, ``and`` and ``or``, ``True`` and ``False``, an
integer ``n`` to ``n + 1``, ``return x`` to ``return None``), at most the mood's ``mutants``,
and the pinned tests run on each mutant in the sandbox, on a private copy of the sealed tree
the verifiers read (never the live tree). First, per changed file, a null mutant (a no-op
line added): the tests must pass on it, or the code tells a copy from the tree and no kill
can be trusted (INCONCLUSIVE). A mutant on which a test fails that passed there is killed
(``judge``: an import error is not); one they pass on survived: a changed line no test
depends on. Survivors make the check FAIL or
INCONCLUSIVE (the mood's ``mutation_survivors``), with each survivor named by file, line and
swap, so the person (and the executor: these are its own lines) sees it.

The check's evidence is the mutants' own sealed runs, each attested (lens ``mutant``, its
target the mutant's tree, never the candidate's): the check's manifest lists one command per
mutant with that run's outcome, and its report names each mutant run's manifest.
"""

from __future__ import annotations

import ast
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
from choir.evidence.artifacts import hash_file
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
            is_spec: Callable[[str], bool], limit: int, *,
            skipped: list[str] | None = None) -> tuple[list[Mutant], int]:
    """At most ``limit`` mutants of the changed lines of ``tree``'s Python files (outside the
    spec), spread over the lines (one swap per line first, round robin), in path order; and
    how many candidate swaps there were in all.

    A swap that no longer parses (``*args`` to ``/args``, ``for x in`` to ``for x not in``)
    is left out: an import error kills nothing (``judge``). A changed file that could not be
    mutated is named in ``skipped``, never passed over in silence: "nothing to mutate" would
    PASS a change no test was tried on (review 22a, F2).
    """
    per_line: list[list[Mutant]] = []
    sources = _sources(tree, base, read_base, is_spec, [] if skipped is None else skipped)
    for rel, (new, lines) in sources.items():
        for line in sorted(lines):
            found = [Mutant(rel, line, b, a, src) for b, a, src in _line_mutants(new, line)]
            if found:
                per_line.append(found)
    total = sum(len(x) for x in per_line)
    chosen: list[Mutant] = []
    parsed = {rel: _parses(new) for rel, (new, lines) in sources.items() if lines}
    depth = 0
    while len(chosen) < limit and any(depth < len(x) for x in per_line):
        for mutant in (x[depth] for x in per_line if depth < len(x)):
            if len(chosen) < limit and (not parsed[mutant.path] or _parses(mutant.source)):
                chosen.append(mutant)
        depth += 1
    return chosen, total


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def _sources(tree: Path, base: dict[str, str], read_base: Callable[[str], str],
             is_spec: Callable[[str], bool], skipped: list[str]) -> dict[str, tuple[str, set[int]]]:
    """Each file to mutate (relative path) with its text and changed lines. A ``.py`` name
    that is a link inside the tree stands for its target, whatever the target is named
    (its lines are diffed against the name's base text, else the target's); a link leaving
    the tree, a changed file over ``MAX_FILE`` and an unreadable one go to ``skipped``."""
    root = tree.resolve()
    found: dict[str, tuple[str, set[int]]] = {}
    for dirpath, dirs, names in os.walk(tree):
        dirs.sort()
        for name in sorted(names):
            path = Path(dirpath) / name
            rel = path.relative_to(tree).as_posix()
            if not name.endswith(".py") or is_spec(rel):
                continue
            real = rel
            if path.is_symlink():
                try:
                    target = path.resolve()
                except (OSError, RuntimeError):  # a loop of links
                    target = Path("/")
                if not target.is_relative_to(root) or not target.is_file():
                    skipped.append(f"{rel} (a link out of the tree, or broken)")
                    continue
                real = target.relative_to(root).as_posix()
                if is_spec(real):
                    continue  # the pinned spec's own text: not the executor's to test
            was = rel if rel in base else real
            try:
                if (root / real).stat().st_size > MAX_FILE:
                    if base.get(was) != hash_file(root / real):  # streamed, not held
                        skipped.append(f"{rel} (too large: over {MAX_FILE} bytes)")
                    continue
                new = (root / real).read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                skipped.append(f"{rel} (unreadable: {exc.strerror or exc})")
                continue
            old = read_base(was) if was in base else ""
            found.setdefault(real, (new, set()))[1].update(changed_lines(old, new))
    return found


def null_mutant(tree: Path, rel: str) -> Mutant:
    """``rel`` with a no-op statement added at its end: the tests must pass on it as on the
    tree itself. Code that tells a copy from the tree (by its path, a hash of its own
    source) fails it, and then no kill can be trusted (review 22a, F1). A statement, not a
    comment: a hash of the tokens or the syntax tree sees it too."""
    text = (tree / rel).read_text(encoding="utf-8", errors="replace")
    text += "\n" if text and not text.endswith("\n") else ""
    return Mutant(rel, text.count("\n") + 1, "(end of file)", "pass", text + "pass\n")


def mutant_tree(tree: Path, mutant: Mutant, root: Path) -> Path:
    """A private, read-only copy of ``tree`` with ``mutant`` applied; the caller removes it.
    Named like a snapshot (a random tree-hash-long name), not as a mutant: code under test
    that reads its own path learns nothing (review 22a, F1)."""
    copy = root / secrets.token_hex(32)
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


# what the last lines of a failed pytest run say when no test ran: not a kill
_BROKEN = re.compile(r"errors? during collection|\b(ImportError|ModuleNotFoundError|"
                     r"SyntaxError)\b")
Judged = Literal["killed", "survived", "unknown"]


def judge(report: VerificationReport, tests: int | None) -> Judged:
    """What one mutant's run says. Killed only when a test that passed on the tree (the null
    mutant ran ``tests`` of them, all passing) now fails. An import or collection error
    (errors, no failed test), every test failing at once (the guard of code that tells a
    mutant from the tree, not a test of the line), a crash, or counts the parser could not
    read say nothing: unknown. A single test is the exception to "every test": it cannot be
    told from a test of the line, and an import error is still no kill. A parser that
    counts no tests (``generic``) leaves only its last error lines: a FAIL is a kill unless
    they name an import or collection error (the null mutant still guards that case)."""
    if report.result is Result.PASS:
        return "survived"
    counts = report.counts
    if counts.run is None and counts.failed is None:  # a parser that counts no tests
        broken = any(_BROKEN.search(s.excerpt) for s in report.failure_signatures)
        return "killed" if report.result is Result.FAIL and not broken else "unknown"
    total = tests if tests is not None else counts.run
    if report.result is not Result.FAIL or not counts.failed or not total:
        return "unknown"
    if total > 1 and counts.failed + (counts.errors or 0) >= total:
        return "unknown"
    return "killed"


def verdict(killed: int, survived: list[str], unknown: int, policy: str, *,
            skipped: int = 0, tricked: bool = False) -> Result:
    """PASS when every mutant was killed; survivors: the policy's FAIL or INCONCLUSIVE;
    mutants whose runs were inconclusive, none surviving: INCONCLUSIVE. So is a changed file
    left unmutated (``skipped``) and code that failed its null mutant (``tricked``): a
    check that could not look is never a PASS."""
    if survived:
        return Result.FAIL if policy == "fail" else Result.INCONCLUSIVE
    if unknown or skipped or tricked:
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
    """Run the null mutants, then (when each passed) the real ones; seal the outcome."""
    mood = rnd.policy.moods[rnd.mood]
    store = rnd.store
    started, clock = datetime.now(UTC), time.monotonic()
    if rnd.base is None:
        raise RuntimeError("no base tree was pinned for this run: nothing to mutate against")
    base = load_manifest(store, rnd.base)

    def read_base(rel: str) -> str:
        return store.read_bytes(base.files[rel][1]).decode("utf-8", "replace")

    skipped: list[str] = []
    found, total = await asyncio.to_thread(
        mutants, rnd.tree, {p: v[1] for p, v in base.files.items() if v[0] != "l"},
        read_base, matcher(rnd.config.spec), mood.mutants, skipped=skipped)
    nulls = [null_mutant(rnd.tree, rel) for rel in dict.fromkeys(m.path for m in found)]
    source = spec.model_copy(update={"kind": rnd.config.verifiers[spec.mutates or ""].kind})
    one = planned.model_copy(update={"diagnostic": True, "lens": "mutant"})
    records: list[CommandRecord] = []
    lines: list[str] = []
    evidence: dict[str, str] = {}
    isolation: Literal["container", "namespace", "none"] = "none"
    root = snapshot_root()

    async def attempt(key: str, mutant: Mutant) -> VerificationReport:
        """``mutant``'s own sealed run, logged and named in the check's evidence."""
        nonlocal isolation
        tree = await asyncio.to_thread(mutant_tree, rnd.tree, mutant, root)
        try:
            target = Target(work_item=rnd.target.work_item,
                            tree_hash=(await asyncio.to_thread(inspect_tree, tree)).tree_hash)
            run, result = await run_one(source, one, f"{run_id}-{key}", tree, target)
        finally:
            await asyncio.to_thread(remove_snapshot, tree)
        outcome = run.report.result
        if result is not None:
            isolation = result.manifest.platform.isolation
        name = f"{'null' if key[0] == 'n' else 'mutant'}-{key[1:]}"
        records.append(CommandRecord(name=name, command=f"{mutant.label()}: "
                                     + " && ".join(s.command for s in spec.steps),
                                     exit_code=0 if outcome is Result.PASS else 1,
                                     duration_ms=0))
        if len(evidence) < 15:
            evidence[name] = run.manifest_hash
        lines.append(f"{name} {mutant.label()}: {outcome.value} (tree "
                     f"{target.tree_hash[:12]}, manifest {run.manifest_hash[:12]})")
        return run.report

    tricked: str | None = None
    tests: int | None = None
    for k, mutant in enumerate(nulls, start=1):
        report = await attempt(f"n{k}", mutant)
        if report.result is not Result.PASS:
            tricked = f"{mutant.path} ({report.result.value})"
            break
        tests = tests or report.counts.run
    killed, unknown, survived = 0, 0, []
    for k, mutant in enumerate(found if tricked is None else [], start=1):
        said = judge(await attempt(f"m{k}", mutant), tests)
        if said == "survived":
            survived.append(mutant.label())
        killed += said == "killed"
        unknown += said == "unknown"
    outcome_ = {"mutants": [m.label() for m in found], "candidates": total,
                "survived": survived, "killed": killed, "inconclusive": unknown,
                "evidence": evidence, "policy": mood.mutation_survivors,
                "skipped": skipped, "tricked": tricked}
    folder = store.run_dir(run_id)
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    lines.insert(0, f"{len(found)} mutants of {total} candidate swaps on the changed lines; "
                    f"killed {killed}, survived {len(survived)}, inconclusive {unknown}; "
                    f"null mutant failed: {tricked or 'no'}; not mutated: "
                    f"{', '.join(skipped) or 'none'}")
    (folder / LOG).write_bytes(("\n".join(lines) + "\n").encode())
    (folder / "mutation.json").write_bytes(canonical_json(outcome_))
    files = store.seal_run(run_id)
    passed = verdict(killed, survived, unknown, mood.mutation_survivors, skipped=len(skipped),
                     tricked=tricked is not None) is Result.PASS
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
    """The bounded report of a mutation check, from its sealed outcome (one sealed before
    review 22a has no ``skipped`` nor ``tricked``)."""
    found, survived = out["mutants"], out["survived"]
    killed, unknown = out["killed"], out["inconclusive"]
    skipped, tricked = out.get("skipped", []), out.get("tricked")
    result = verdict(killed, survived, unknown, out["policy"], skipped=len(skipped),
                     tricked=tricked is not None)
    actions: list[str] = []
    if tricked:
        summary = (f"the code under test tells a mutant from the tree: its null mutant (a "
                   f"no-op 'pass' added to {tricked}) did not pass, so no kill can be trusted")
        actions.append("The code behaves differently in a copy of the tree: remove what "
                       "checks its own path or source, then rerun.")
    elif survived:
        summary = (f"{len(survived)} of {len(found)} mutants of the changed lines survived the "
                   f"pinned tests: {'; '.join(survived[:4])}")
        actions.append("A changed line no pinned test depends on: test the change (a work "
                       "item may add tests with may_change_spec) or drop the line.")
    elif not found:
        summary = ("no mutant was made" if skipped
                   else "no changed Python line outside the spec to mutate")
    else:
        summary = f"{killed} of {len(found)} mutants of the changed lines were killed" + (
            f"; {unknown} told nothing (an import or collection error, every test failing)"
            if unknown else "")
    if unknown and not tricked:
        actions.append("A mutant's run told nothing: keep the change importable whatever its "
                       "lines say, and use a parser that counts tests (junit, pytest).")
    if skipped:
        summary += (f"; {len(skipped)} changed Python file(s) not mutated: "
                    f"{', '.join(skipped[:3])}")
        actions.append("Keep changed modules under the size limit and links inside the tree, "
                       "or have a person review the change.")
    return VerificationReport(
        verifier=planned.name, verifier_type="mutation", target=rnd.target, result=result,
        summary=summary[:480], confidence=1.0,
        counts=Counts(run=len(found), failed=len(survived), errors=unknown),
        artifacts=dict(out["evidence"]),
        next_actions=tuple(actions[:3]) or ("None: the pinned tests depend on every mutated "
                                            "line.",))
