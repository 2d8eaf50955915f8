"""Choir's verified work-item loop as a node in your own LangGraph graph (map-reduce).

    python examples/team/map_reduce.py

Your graph fans a backlog out with ``Send``, one copy of Choir's subgraph per work item
(each runs the whole loop in its own sandbox: execute, plan, verify, attest, adjudicate),
then reduces: only outcomes that are ``asserted`` are verified work. A supervisor is the
same node behind a conditional edge. ``choir plan run`` drives every plan item through
this same subgraph (``choir.team.subgraph``).
"""

from __future__ import annotations

import asyncio
import operator
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from choir.team.subgraph import work_item_graph


class Backlog(TypedDict, total=False):
    work_items: list[str]  # work item files
    outcomes: Annotated[list[dict[str, Any]], operator.add]  # filled by Choir's subgraph
    verified: list[str]  # the reduce step's answer


def fan_out(state: Backlog) -> list[Send]:
    return [Send("choir", {"work_item": path}) for path in state["work_items"]]


def reduce(state: Backlog) -> dict[str, Any]:
    return {"verified": sorted(o["work_item"] for o in state["outcomes"]
                               if o["status"] == "asserted")}


def build() -> Any:
    graph = StateGraph(Backlog)
    graph.add_node("choir", work_item_graph())  # the verified loop, as one node
    graph.add_node("reduce", reduce)
    graph.add_conditional_edges(START, fan_out, ["choir"])
    graph.add_edge("choir", "reduce")
    graph.add_edge("reduce", END)
    return graph.compile()


def work_item(folder: Path, item_id: str, repo: Path, command: str) -> str:
    path = folder / f"{item_id}.yaml"
    path.write_text(f"id: {item_id}\ngoal: {command}\nrepo: {repo}\nmax_attempts: 1\n"
                    f"executor: {{kind: command, command: '{command}'}}\n")
    return str(path)


def main(repos: list[Path], folder: Path) -> Backlog:
    """Two work items on two repos: one honest change, one that breaks the tree."""
    items = [work_item(folder, "good", repos[0], "echo A > a.txt"),
             work_item(folder, "bad", repos[1], "echo BROKEN > a.txt")]
    result: Backlog = asyncio.run(build().ainvoke({"work_items": items}))
    return result


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        here = Path(__file__).parent / "repo"
        made = []
        for name in ("one", "two"):
            repo = Path(tmp) / name
            shutil.copytree(here, repo)
            for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                         ["-c", "user.name=demo", "-c", "user.email=demo@localhost", "commit",
                          "-qm", "base"]):
                subprocess.run(["git", "-C", str(repo), *args], check=True)
            made.append(repo)
        out = main(made, Path(tmp))
        for o in out["outcomes"]:
            print(f"{o['work_item']:<6} {o['status']:<10} {o['reason'][:70]}")
        print("verified:", ", ".join(out["verified"]) or "(none)")
        sys.exit(0 if out["verified"] == ["good"] else 1)
