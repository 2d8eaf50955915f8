"""Team plans as the viewer shows them: the durable plan record, read as hostile bytes.

``choir plan run`` rewrites ``plans/PLAN_ID/state.json`` after every transition. A viewer
reads it like any other stored evidence: the id is checked before any path is built, the
folder must be a real folder and the record a regular file opened without following a
symlink, at most ``MAX_RECORD`` bytes are read, and a record that is too big, not JSON or
not the expected shape is shown as unreadable, never trusted. Every string taken from it is
cut and stripped of control sequences here; the templates escape it.

The dependency graph is laid out on the server (layers by dependency depth) and drawn as an
inline SVG: the pages allow no script, and a drawing needs none.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from choir._core.terminal import strip_controls
from choir.exceptions import NotFoundError, UserError

MAX_RECORD = 4 << 20
MAX_ITEMS = 400  # items drawn and listed; a record with more says so
MAX_DEPS = 50  # dependencies per item drawn
_PLAN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_PLAN_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")  # a run id the run page takes
STATES = ("merged", "asserted", "running", "pending", "split", "failed", "blocked")

# the drawing's geometry (SVG user units)
NODE_W, NODE_H, COL_W, ROW_H, PAD = 170, 46, 230, 64, 16


def clean(value: Any, limit: int = 300) -> str:
    """A string from the record as inert text of at most ``limit`` characters."""
    return strip_controls(str(value if value is not None else ""))[:limit]


def check_plan_id(plan_id: str) -> str:
    """Raises:
        UserError: ``plan_id`` could not name a plan (so it never becomes a path)."""
    if not _PLAN_ID.match(plan_id) or ".." in plan_id:
        raise UserError(f"not a plan id: {plan_id[:80]!r}")
    return plan_id


def read_record(home: Path, plan_id: str) -> tuple[dict[str, Any] | None, str]:
    """(record, why it cannot be read) for ``plan_id``.

    Raises:
        UserError: a malformed id. NotFoundError: no plan folder of this id.
    """
    folder = home / "plans" / check_plan_id(plan_id)
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return None, "the plan folder is not a folder (a symlink is not followed)"
    except OSError:
        raise NotFoundError(f"no plan {plan_id!r} is stored here") from None
    try:
        fd = os.open(folder / "state.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"the record cannot be opened ({exc.strerror}; a symlink is not followed)"
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "the record is not a regular file"
        if st.st_size > MAX_RECORD:
            return None, f"the record is {st.st_size} bytes, over the {MAX_RECORD} read"
        data = fh.read(MAX_RECORD + 1)
    if len(data) > MAX_RECORD:
        return None, f"the record is over the {MAX_RECORD} bytes read"
    try:
        record = json.loads(data)
    except ValueError as exc:
        return None, f"the record is not JSON: {clean(exc, 200)}"
    if not isinstance(record, dict) or not isinstance(record.get("items"), dict):
        return None, "the record is not a plan record (no items)"
    return record, ""


@dataclass(frozen=True)
class ItemView:
    id: str
    state: str  # one of STATES, or "unknown"
    member: str
    goal: str
    attempt: int
    last: str
    commit: str
    run_ids: tuple[str, ...]  # one per attempt, oldest first
    depends_on: tuple[str, ...]
    sent_back: int


@dataclass(frozen=True)
class Node:
    item: ItemView
    x: int
    y: int
    label: str


@dataclass(frozen=True)
class Edge:
    x1: int
    y1: int
    x2: int
    y2: int
    dep: str
    item: str
    points: str = ""  # the SVG polyline: straight, or around the columns it skips


def _edge(src: Node, dst: Node, dep: str) -> Edge:
    """From ``src``'s right side to ``dst``'s left. An edge that skips a column runs in the
    gap between rows (above the higher end), never through a node in between."""
    x1, y1, x2, y2 = src.x + NODE_W, src.y + NODE_H // 2, dst.x, dst.y + NODE_H // 2
    route = [(x1, y1), (x2, y2)]
    if x2 - x1 > COL_W:
        lane = min(src.y, dst.y) - (ROW_H - NODE_H) // 2
        route[1:1] = [(x1 + 12, lane), (x2 - 12, lane)]
    return Edge(x1, y1, x2, y2, dep, dst.item.id, " ".join(f"{x},{y}" for x, y in route))


@dataclass(frozen=True)
class PlanView:
    plan_id: str
    status: str
    error: str  # why the record is unreadable ("" when it was read)
    repo: str = ""
    base: str = ""
    integration: str = ""
    integration_tree: str = ""
    updated: str = ""
    items: tuple[ItemView, ...] = ()
    more_items: int = 0  # items past MAX_ITEMS, not shown
    nodes: tuple[Node, ...] = ()
    edges: tuple[Edge, ...] = ()
    width: int = 0
    height: int = 0
    promotions: tuple[dict[str, str], ...] = ()
    spend: tuple[tuple[str, str], ...] = ()


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and \
        0 <= value < 1 << 31 else 0


def _item(plan_id: str, item_id: str, row: Any) -> ItemView:
    row = row if isinstance(row, dict) else {}
    state = clean(row.get("state"), 40).lower()
    attempt = _int(row.get("attempt"))
    # a part split from an item (``a~1``) runs as ``PLAN.a-part1.N.part`` (choir.team.schedule)
    prefix, suffix = (f"{plan_id}.{item_id.replace('~', '-part')}", ".part") if "~" in item_id \
        else (f"{plan_id}.{item_id}", "")
    runs = tuple(f"{prefix}.{n}{suffix}" for n in range(1, min(attempt, 20) + 1)
                 if _PLAN_RUN.match(f"{prefix}.{n}{suffix}"))
    deps = row.get("depends_on")
    return ItemView(id=clean(item_id, 100), state=state if state in STATES else "unknown",
                    member=clean(row.get("member"), 100), goal=clean(row.get("goal")),
                    attempt=attempt, last=clean(row.get("last")),
                    commit=clean(row.get("commit"), 64), run_ids=runs,
                    depends_on=tuple(clean(d, 100) for d in deps[:MAX_DEPS])
                    if isinstance(deps, list) else (), sent_back=_int(row.get("sent_back")))



def layers(items: tuple[ItemView, ...]) -> dict[str, int]:
    """Each item's dependency depth (0: depends on nothing known). A cycle, which a hostile
    record may hold, is cut where it closes."""
    deps = {i.id: [d for d in i.depends_on if d != i.id] for i in items}
    depth: dict[str, int] = {}
    for start in deps:
        stack, on_path = [(start, iter(deps[start]))], {start}
        while stack:
            node, todo = stack[-1]
            dep = next((d for d in todo if d in deps and d not in on_path), None)
            if dep is None:
                stack.pop()
                on_path.discard(node)
                known = [depth[d] + 1 for d in deps[node] if d in depth]
                depth[node] = max(known, default=0)
            elif dep not in depth:
                stack.append((dep, iter(deps[dep])))
                on_path.add(dep)
    return depth


def layout(items: tuple[ItemView, ...]) -> tuple[tuple[Node, ...], tuple[Edge, ...], int, int]:
    """Nodes in columns by depth (rows in record order), and an edge per known dependency."""
    depth = layers(items)
    rows: dict[int, int] = {}
    nodes: dict[str, Node] = {}
    for item in items:
        col = depth.get(item.id, 0)
        row = rows[col] = rows.get(col, -1) + 1
        nodes[item.id] = Node(item, PAD + col * COL_W, PAD + row * ROW_H,
                              item.id if len(item.id) <= 22 else item.id[:21] + "…")
    edges = tuple(_edge(nodes[d], n, d) for n in nodes.values() for d in n.item.depends_on
                  if d in nodes and d != n.item.id)
    width = PAD * 2 + (max(depth.values(), default=0)) * COL_W + NODE_W
    height = PAD * 2 + max(rows.values(), default=0) * ROW_H + NODE_H
    return tuple(nodes.values()), edges, width, height


def plan_view(home: Path, plan_id: str) -> PlanView:
    """The plan's page, from its record (unreadable: ``error`` says why)."""
    record, error = read_record(home, plan_id)
    if record is None:
        return PlanView(plan_id=plan_id, status="unreadable", error=error)
    rows = list(record["items"].items())
    items = tuple(_item(plan_id, str(k), v) for k, v in rows[:MAX_ITEMS])
    nodes, edges, width, height = layout(items)
    promos = record.get("promotions")
    spend = record.get("spend")
    return PlanView(
        plan_id=plan_id, status=clean(record.get("status"), 40) or "unknown", error="",
        repo=clean(record.get("repo"), 500), base=clean(record.get("base"), 64),
        integration=clean(record.get("integration"), 64),
        integration_tree=clean(record.get("integration_tree"), 64),
        updated=clean(record.get("updated"), 40), items=items,
        more_items=max(0, len(rows) - MAX_ITEMS), nodes=nodes, edges=edges, width=width,
        height=height,
        promotions=tuple({k: clean(p.get(k), 100) for k in ("to", "commit", "tree", "from", "at")}
                         for p in (promos[:100] if isinstance(promos, list) else [])
                         if isinstance(p, dict)),
        spend=tuple((clean(who, 100), clean(json.dumps(v, sort_keys=True)[:300]))
                    for who, v in list(spend.items())[:50]) if isinstance(spend, dict) else ())


def plan_summary(home: Path, plan_id: str) -> tuple[str, str]:
    """(status, updated) for the run list; status ``unreadable`` when the record cannot be
    read."""
    try:
        record, _ = read_record(home, plan_id)
    except (UserError, NotFoundError):
        return "unreadable", ""
    if record is None:
        return "unreadable", ""
    return clean(record.get("status"), 40) or "unknown", clean(record.get("updated"), 40)
