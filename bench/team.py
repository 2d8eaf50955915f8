"""Teams: what a plan costs against the same work in series, and what the driver adds.

    python bench/team.py [--files 2000] [--runs 7] [--skip-plans] [--chain8] [--round-s S]
                         [--member-s S] [--profile]

1. A worktree for a ``--files`` repo: the driver's ``add_worktree`` (through the hardened
   git helper) against bare ``git worktree add`` on the same repo, medians of ``--runs``.
2. 8 independent items on 4 members (``max_parallel: 4``) against 2 items in series (a
   dependency chain, ``max_parallel: 1``), each item a real run: a scripted member in bwrap,
   a pytest verifier in bwrap, signed attestations, a gated merge and a verified
   integration round. The target: at most 1.3x. ``--chain8``: the 8 one after another too,
   to show what running them side by side buys on this machine; ``--round-s S``: every
   verification round also waits S seconds (a suite bound by I/O rather than CPU);
   ``--member-s S``: every member waits S seconds before its change (the model's reply an
   agent's item spends most of its time on; the scripted members otherwise take none).
3. The driver's own cost per item: the series plan's wall time less the time spent inside
   the items' runs and integration rounds (recorded per item), divided by its items; with
   ``--chain8`` also split into a cost per plan (its start and end) and one per item, from
   the plans of 2 and of 8. The machine's busy CPU seconds (``/proc/stat``) over each plan
   show whether the 8 could fit in 1.3x the 2 on this many cores at all.
   ``--profile``: where that cost goes (the driver's own calls, timed in the plan's process:
   git processes, checkpoint writes, the gate, the published record), per item, in the
   series plan of 2 (of 8 with ``--chain8``), and what is left of it outside git processes:
   the scheduling itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import ctypes
import functools
import inspect
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from choir.evidence.git import locate  # noqa: E402
from choir.evidence.worktrees import release  # noqa: E402


def _repo(root: Path, files: int) -> Path:
    repo = root / "repo"
    for i in range(files):
        sub = repo / f"pkg{i % 40}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"m{i}.py").write_text(f"X = {i}\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b",
                    "commit", "-qm", "base"], check=True)
    return repo


def worktrees(files: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp), files)
        git = locate(repo)
        assert git is not None
        bare, ours = [], []
        for n in range(runs):
            path = Path(tmp) / f"bare{n}"
            t = time.perf_counter()
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "-b", f"b{n}",
                            str(path), "main"], check=True)
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            git.add_worktree(Path(tmp) / f"ours{n}", f"choir/bench/{n}", "main")
            ours.append(time.perf_counter() - t)
        for n in range(runs):  # an overlay worktree's mount, released before the folder goes
            release(Path(tmp) / f"ours{n}")
        b, o = statistics.median(bare), statistics.median(ours)
        print(f"worktree for {files} files: bare git {b * 1000:.0f} ms, "
              f"driver {o * 1000:.0f} ms ({o / b:.2f}x)")


ROUND_S = 0.0  # --round-s: every round of the repo's verifier waits this long
MEMBER_S = 0.0  # --member-s: every member's run waits this long first (a model's reply)


def _plan(root: Path, plan_id: str, n: int, chain: bool,
          parallel: int) -> dict:  # type: ignore[type-arg]
    import choir.graph.runner  # noqa: F401  (imported up front: a one-time cost, not per item)
    import choir.team.subgraph  # noqa: F401
    from choir.team.driver import run_plan
    from choir.team.plan import load_plan
    from tests.team import team_repo

    team_repo(root / "repo", slow_s=ROUND_S)
    # each member writes a file of its own name, so independent items never conflict
    wait = f"sleep {MEMBER_S:g} && " if MEMBER_S else ""
    members = "".join(f"  m{k}:\n    executor: {{kind: command, command: "
                      f"'{wait}echo {k} > $(mktemp -p . f{k}.XXXXXX.txt)'}}\n"
                      for k in range(4))
    items = "".join(f"  - id: i{k}\n    goal: file {k}\n    member: m{k % 4}\n"
                    f"    max_attempts: 1\n" + (f"    depends_on: [i{k - 1}]\n"
                                                 if chain and k else "")
                    for k in range(n))
    (root / "plan.yaml").write_text(
        f"id: {plan_id}\nrepo: ./repo\nbase: main\nmax_parallel: {parallel}\n"
        f"members:\n{members}items:\n{items}")
    t, busy = time.perf_counter(), _busy_s()
    state = asyncio.run(run_plan(load_plan(root / "plan.yaml")))
    state["wall_s"] = time.perf_counter() - t
    state["busy_s"] = _busy_s() - busy
    assert state["status"] == "asserted", state
    return state


def _busy_s() -> float:
    """CPU seconds every core of the machine has spent busy (``/proc/stat``): what the
    plan's whole process tree used, sandboxed steps in their own pid namespaces included,
    on a machine otherwise quiet."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


GIT_WRITES = "git writes (the config listing kept per digest)"
GIT_READS = "git reads"
INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("inside", default=False)


class Profile:
    """The driver's own calls, timed in the plan's process while the block runs: calls made
    inside an item's run or an integration round (their tasks, and the threads they start)
    are not the driver's, and are left out.
    """

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {}
        self.undo: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, name: str, label: str | None) -> None:
        """Time ``owner.name`` under ``label``; ``None``: mark what it runs as inside."""
        original = getattr(owner, name)
        spent = self.spent.setdefault(label, [0.0, 0]) if label else [0.0, 0]

        if inspect.iscoroutinefunction(original):
            @functools.wraps(original)
            async def timed_async(*args: object, **kwargs: object) -> object:
                if label is None:
                    INSIDE.set(True)
                t, mine = time.perf_counter(), not INSIDE.get()
                try:
                    return await original(*args, **kwargs)
                finally:
                    if mine:
                        spent[0] += time.perf_counter() - t
                        spent[1] += 1
            setattr(owner, name, timed_async)
        else:
            @functools.wraps(original)
            def timed(*args: object, **kwargs: object) -> object:
                t, mine = time.perf_counter(), not INSIDE.get()
                try:
                    return original(*args, **kwargs)
                finally:
                    if mine:
                        spent[0] += time.perf_counter() - t
                        spent[1] += 1
            setattr(owner, name, timed)
        self.undo.append((owner, name, original))

    def __enter__(self) -> Profile:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        import choir.team.driver as driver
        import choir.team.moves as moves
        import choir.team.queue as queue
        from choir.evidence.git import GitRepo

        for owner, name, label in (
                (driver.Driver, "_run", None), (queue, "verify_tree", None),
                (GitRepo, "write", GIT_WRITES),
                (GitRepo, "run", GIT_READS),
                (GitRepo, "add_worktree", "  of which worktrees made"),
                (queue, "commit_tree_hash", "  of which tree hashes of commits"),
                (queue, "check_gate", "gate checks (an item's, when it lands)"),
                (driver, "check_gate", "gate check (the plan's, at the end)"),
                (moves.Moves, "_commit", "an item's commit"),
                (queue.MergeQueue, "build", "queue: heads built (merge-tree, worktree)"),
                (queue.MergeQueue, "land", "queue: landings (gate, event, ref)"),
                (queue.MergeQueue, "drop", "queue: heads' worktrees removed"),
                (moves.Moves, "advance", "moves made (all of the above but finish)"),
                (moves.Moves, "apply", "results applied"),
                (driver.Driver, "_publish", "the published record (state.json)"),
                (AsyncSqliteSaver, "aput", "checkpoint writes"),
                (driver.Driver, "finish", "finish (gate, worktrees removed)"),
                (driver.Driver, "__init__", "start: the driver (the repo located)"),
                (driver.Driver, "initial", "start: the record, the integration branch"),
                (driver.Driver, "graph", "start: the graph built"),
                (AsyncSqliteSaver, "setup", "start: the checkpointer's tables"),
                (driver, "run_plan", "the whole plan (runs and rounds included)")):
            self.wrap(owner, name, label)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self.undo):
            setattr(owner, name, original)

    def show(self, items: int) -> None:
        for label, (seconds, calls) in self.spent.items():
            print(f"  {label:<52} {seconds * 1000 / items:8.1f} ms/item  ({calls} calls)")


def plans(profile: bool = False, chain8: bool = False) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # a plan of one first, not measured: what the first use of a home costs once (its
        # checkpoint and AHDB tables made, the signing key, the store's folders) is not a
        # cost of every plan, and landed on whichever plan came first
        _plan(Path(tmp) / "first", "first", 1, chain=True, parallel=1)
        if profile:  # the series plan of 2 (of 8 with --chain8), its driver's calls timed
            with Profile() as prof:
                series = _plan(Path(tmp) / "series", "series", 8 if chain8 else 2, chain=True,
                               parallel=1)
            inside = sum(r.get("run_s", 0) + r.get("integration_s", 0)
                         for r in series["items"].values())
            print(f"series plan of {len(series['items'])}: {series['wall_s']:.1f} s, "
                  f"{inside:.1f} s inside runs "
                  f"and rounds; the driver's calls per item:")
            prof.show(len(series["items"]))
            items = len(series["items"])
            git = sum(prof.spent.get(k, [0.0])[0] for k in (GIT_WRITES, GIT_READS))
            own = (series["wall_s"] - inside) / items
            print(f"the driver's own cost per item: {own * 1000:.0f} ms, of which git "
                  f"processes {git / items * 1000:.0f} ms (worktrees, the "
                  f"commit, the merge, the landing) and the scheduling itself (the graph's "
                  f"steps, checkpoints, the record) "
                  f"{(series['wall_s'] - inside - git) / items * 1000:.0f} ms")
            return
        series = _plan(Path(tmp) / "series", "series", 2, chain=True, parallel=1)
        wide = _plan(Path(tmp) / "wide", "wide", 8, chain=False, parallel=4)
        inside = sum(r.get("run_s", 0) + r.get("integration_s", 0)
                     for r in series["items"].values())
        overhead = (series["wall_s"] - inside) / len(series["items"])
        runs = [r["run_s"] for r in wide["items"].values()]
        integ = [r["integration_s"] for r in wide["items"].values()]
        print(f"2 items in series: {series['wall_s']:.1f} s; 8 independent on 4 members: "
              f"{wide['wall_s']:.1f} s ({wide['wall_s'] / series['wall_s']:.2f}x; target "
              f"1.3x); in the 8: item runs median {statistics.median(runs):.1f} s, "
              f"integration rounds {sum(integ):.1f} s in all (side by side)")
        cores = os.cpu_count() or 1
        floor = wide["busy_s"] / cores  # the 8's CPU spread perfectly over every core
        print(f"CPU: the 2 in series kept {series['busy_s']:.1f} s of it busy "
              f"({series['busy_s'] / series['wall_s'] / cores:.0%} of {cores} cores), "
              f"the 8 on 4 members {wide['busy_s']:.1f} s "
              f"({wide['busy_s'] / wide['wall_s'] / cores:.0%}): on {cores} cores the 8 "
              f"cannot take less than {floor:.1f} s, {floor / series['wall_s']:.2f}x the 2")
        if chain8:
            # the same 8 one after another: what running them 4 wide bought on this machine
            # (the 1.3x target needs 8 / 2 / 1.3 = 3.1x from running side by side)
            eight = _plan(Path(tmp) / "eight", "eight", 8, chain=True, parallel=1)
            inside8 = sum(r.get("run_s", 0) + r.get("integration_s", 0)
                          for r in eight["items"].values())
            over2 = series["wall_s"] - inside
            over8 = eight["wall_s"] - inside8
            print(f"driver overhead per item, the 8 in series (the plan's start and end "
                  f"shared by 8): {over8 / 8 * 1000:.0f} ms; split as a fixed cost per "
                  f"plan and one per item (from the plans of 2 and 8): "
                  f"{(over2 - 2 * (over8 - over2) / 6) * 1000:.0f} ms per plan, "
                  f"{(over8 - over2) / 6 * 1000:.0f} ms per item")
            print(f"the 8 in series: {eight['wall_s']:.1f} s "
                  f"({eight['wall_s'] / series['wall_s']:.2f}x the 2); 4 wide made them "
                  f"{eight['wall_s'] / wide['wall_s']:.2f}x faster on {os.cpu_count()} cores "
                  "(the target needs 3.08x)")
        print(f"driver overhead per item (series plan, outside runs and integration "
              f"rounds): {overhead * 1000:.0f} ms (target 50 ms)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--skip-plans", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="only the series plan, with the driver's calls timed")
    ap.add_argument("--round-s", type=float, default=0.0,
                    help="every verification round also waits this long (a suite bound by "
                         "I/O or a service rather than by CPU)")
    ap.add_argument("--member-s", type=float, default=0.0,
                    help="every member's run first waits this long (its model's reply: what "
                         "an agent's item spends most of its time on)")
    ap.add_argument("--chain8", action="store_true",
                    help="also the 8 items one after another, for the speedup of 4 wide")
    args = ap.parse_args()
    global ROUND_S, MEMBER_S
    ROUND_S, MEMBER_S = args.round_s, args.member_s
    with confined():
        if args.profile:
            plans(profile=True, chain8=args.chain8)
            return
        worktrees(args.files, args.runs)
        if not args.skip_plans:
            plans(chain8=args.chain8)


@contextlib.contextmanager
def confined() -> Iterator[None]:
    """Everything measured as ``choir plan run`` runs: its signing key behind the broker, the
    process in a mount namespace of its own (so its worktrees are overlays of the store's
    checkouts), its process-lifetime caches on, in a home of its own; the key folder's mask
    unmounted at the end, so the home can be removed."""
    from choir._core import warm
    from choir.trusted import keys_dir, separate

    home = Path(tempfile.mkdtemp(prefix="choir-bench-team-"))
    os.environ["CHOIR_HOME"] = str(home)
    keys = keys_dir(home)
    level = separate(home)
    warm.enable()  # as choir plan run does: policies, presets and plugins read once
    print(f"confined as choir plan run is: {level}")
    try:
        yield
    finally:
        ctypes.CDLL(None).umount2(os.fsencode(keys), 2)  # MNT_DETACH
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
