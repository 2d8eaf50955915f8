"""``choir view`` over team plans: a real ``choir plan run`` in the run list and on its own
page (items, runs, the dependency graph as server-drawn SVG), and hostile plan records
beside it (markup and terminal sequences, symlinks, a FIFO, 50 MB, bad JSON, a cycle) shown
inert, bounded and as unreadable rows, never followed or trusted."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.viewhome import run_plan, view_server

# the real plans (whole runs) are in CI's slow stage; the hostile records run by default
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

ITEMS = """\
    - id: a
      goal: write a
      executor: {kind: command, command: 'echo A > a.txt'}
    - id: b
      goal: copy a
      executor: {kind: command, command: 'echo A > b.txt'}
      depends_on: [a]
    - id: bad
      goal: breaks the tree
      max_attempts: 1
      executor: {kind: command, command: 'echo BROKEN > h.txt'}
    - id: after
      goal: needs bad and a
      member: worker
      depends_on: [bad, a]
    """
EVIL = "<script>alert(1)</script>\x1b[31mRED\x1b]52;c;cHduZWQ=\x07\x1b]8;;https://evil.example/\x07"


def _record(home: Path, name: str, body: bytes | str) -> Path:
    folder = home / "plans" / name
    folder.mkdir(parents=True)
    path = folder / "state.json"
    path.write_bytes(body.encode() if isinstance(body, str) else body)
    return path


def _hostile(home: Path) -> None:
    """Plan records no driver wrote: each must be inert, bounded and never followed."""
    evil_items = {f"x{EVIL}": {"state": "running", "attempt": 1, "run_id": "", "member": EVIL,
                               "goal": EVIL, "last": EVIL, "depends_on": ["y", f"x{EVIL}"]},
                  "y": {"state": "<b>pwn</b>", "attempt": "9", "depends_on": [f"x{EVIL}"]}}
    _record(home, "evil", json.dumps({"plan": "evil", "status": EVIL, "repo": EVIL,
                                      "updated": "2000-01-01T00:00:00", "items": evil_items,
                                      "promotions": [{"to": EVIL, "commit": EVIL}],
                                      "spend": {EVIL: {"cost_usd": 1}}}))
    secret = home / "secret.json"
    secret.write_text(json.dumps({"status": "SECRET-FOLLOWED", "items": {"s": {}}}))
    (home / "plans" / "linked").mkdir(parents=True)
    os.symlink(secret, home / "plans" / "linked" / "state.json")
    outside = home / "outside"
    outside.mkdir()
    shutil.copy(secret, outside / "state.json")
    os.symlink(outside, home / "plans" / "dirlink")
    huge = _record(home, "huge", b"")
    with huge.open("wb") as fh:
        fh.write(b'{"status": "HUGE-READ", "items": {}, "pad": "')
        fh.write(b"x" * (50 << 20))
        fh.write(b'"}')
    chain = {f"i{n:04}": {"state": "pending", "depends_on": [f"i{n - 1:04}", f"i{n + 1:04}"]}
             for n in range(1000)}  # a 1000-long chain, each also waiting for the next
    _record(home, "long", json.dumps({"status": "running", "items": chain}))
    _record(home, "broken", '{"status": "BROKEN-READ", "items": {')
    _record(home, "notaplan", '["a list"]')
    (home / "plans" / "fifo").mkdir()
    os.mkfifo(home / "plans" / "fifo" / "state.json")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real plans (one with a failed and a blocked item; one promoted), and the hostile
    records beside them."""
    work = tmp_path_factory.mktemp("viewplans")
    home = work / "home"
    state = run_plan(work, home, "vp", ITEMS)
    assert {k: v["state"] for k, v in state["items"].items()} == {  # type: ignore[attr-defined]
        "a": "merged", "b": "merged", "bad": "failed", "after": "blocked"}
    run_plan(work / "second", home, "shipped", """\
        - id: only
          goal: write a
          executor: {kind: command, command: 'echo A > a.txt'}
        """, promote_to="release")
    _hostile(home)
    return home


def _client(home: Path) -> Iterator[httpx.Client]:
    with view_server(home) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        yield c


def _root(client: httpx.Client) -> str:
    """The path prefix this launch of the viewer serves under (its links start with it)."""
    return urlsplit(str(client.base_url)).path.rstrip("/")


@pytest.fixture(scope="module")
def client(home: Path) -> Iterator[httpx.Client]:
    yield from _client(home)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """The hostile records alone: no plan runs, so these tests stay in the default run."""
    home = tmp_path_factory.mktemp("viewhostile") / "home"
    _hostile(home)
    yield from _client(home)


@pytest.mark.slow
@needs_bwrap
def test_a_plan_is_listed_with_its_status_and_filters_like_the_runs(
        client: httpx.Client) -> None:
    root = _root(client)  # every link names the viewer's prefix
    page = client.get("/?kind=plan")
    assert page.status_code == 200
    rows = re.findall(rf'href="{root}/plan/([^"]+)">', page.text)
    assert rows[:2] == ["shipped", "vp"]  # newest first: the hostile ones are old or undated
    assert set(rows) == {"shipped", "vp", "evil", "long", "linked", "dirlink", "huge", "broken",
                         "notaplan", "fifo"}
    assert f'href="{root}/run/' not in page.text  # only plans
    vp_row = page.text.split(f'href="{root}/plan/vp">')[1].split("</tr>")[0]
    assert "v-failed" in vp_row  # one item failed: the plan did not assert
    assert "v-asserted" in page.text.split(f'href="{root}/plan/shipped">')[1].split("</tr>")[0]
    assert set(re.findall(rf'href="{root}/plan/([^"]+)">', client.get("/?status=asserted").text)) \
        == {"shipped"}
    unreadable = client.get("/?kind=plan&status=unreadable").text
    assert set(re.findall(rf'href="{root}/plan/([^"]+)">', unreadable)) == {
        "linked", "dirlink", "huge", "broken", "notaplan", "fifo"}
    assert "run" not in re.findall(r"<td>(run|verify|plan)</td>", client.get("/?kind=plan").text)


@pytest.mark.slow
@needs_bwrap
def test_the_plan_page_draws_items_states_and_dependencies(client: httpx.Client) -> None:
    root = _root(client)  # every link names the viewer's prefix
    page = client.get("/plan/vp")
    assert page.status_code == 200, page.text
    nodes = dict(re.findall(r'<g class="node n-\w+" data-item="([^"]+)" data-state="(\w+)"',
                            page.text))
    assert nodes == {"a": "merged", "b": "merged", "bad": "failed", "after": "blocked"}
    edges = set(re.findall(r'class="edge" data-from="([^"]+)" data-to="([^"]+)"', page.text))
    assert edges == {("a", "b"), ("bad", "after"), ("a", "after")}
    xs = dict(re.findall(r'data-item="(\w+)"[^>]*>\s*<title>[^<]*</title>\s*<rect x="(\d+)"',
                         page.text))
    assert xs["a"] == xs["bad"] < xs["b"] == xs["after"]  # layers by dependency depth
    assert "<script" not in page.text
    for state in ("merged", "running", "failed", "blocked", "pending"):
        assert f'<span class="swatch n-{state}"></span>{state}' in page.text  # the legend
    # each item's run is linked, and its page is the run's timeline
    assert f'href="{root}/run/vp.a.1"' in page.text and f'href="{root}/run/vp.bad.1"' in page.text
    assert client.get("/run/vp.a.1").status_code == 200
    row = page.text.split('<td class="id">bad<')[1].split("</tr>")[0]  # its last verdict
    assert "breaks the tree" in row and "halted" in row.lower(), row
    rounds = page.text.split("Integration rounds kept")[1]
    assert rounds.count("<td>integrate</td>") == 2  # a and b merged, each round kept


@pytest.mark.slow
@needs_bwrap
def test_a_promoted_plan_shows_its_round_and_its_release(client: httpx.Client) -> None:
    page = client.get("/plan/shipped").text
    assert 'data-item="only" data-state="merged"' in page
    rounds, promotions = page.split("Integration rounds kept")[1].split("<h2>Promotions</h2>")
    assert rounds.count("<td>integrate</td><td>shipped.only</td>") == 1
    assert rounds.count("<td>release</td><td>release</td>") == 1  # the event, its branch
    assert promotions.count("<tr><td>release</td>") == 1


def test_unreadable_plans_are_listed_as_such(hostile: httpx.Client) -> None:
    root = _root(hostile)  # every link names the viewer's prefix
    listed = hostile.get("/?kind=plan&status=unreadable").text
    assert set(re.findall(rf'href="{root}/plan/([^"]+)">', listed)) == {
        "linked", "dirlink", "huge", "broken", "notaplan", "fifo"}
    assert "&lt;script&gt;" in hostile.get("/?kind=plan").text  # evil's status, escaped


def test_a_hostile_plan_record_is_shown_inert(hostile: httpx.Client) -> None:
    page = hostile.get("/plan/evil")
    assert page.status_code == 200
    text = page.text
    assert "<script>alert" not in text and "<b>pwn</b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text)  # no ESC, no BEL
    assert "evil.example" not in text and "cHduZWQ" not in text  # OSC 8 and 52 gone whole
    assert 'data-state="unknown"' in text and 'data-state="running"' in text
    assert text.count('class="edge"') == 2  # x<->y drawn once each way, no self edge, no hang


def test_a_long_cyclic_plan_is_drawn_bounded(hostile: httpx.Client) -> None:
    page = hostile.get("/plan/long").text
    assert page.count('<g class="node') == 400 and "600 more not shown" in page
    assert page.count('class="edge"') == 2 * 399  # each pair both ways, none to the unshown
    assert len(page) < 1_500_000


@pytest.mark.parametrize("name,why", [
    ("linked", "symlink is not followed"), ("dirlink", "not a folder"),
    ("huge", "over the"), ("broken", "not JSON"), ("notaplan", "not a plan record"),
    ("fifo", "not a regular file")])
def test_an_unreadable_record_is_said_so_never_followed_or_read_whole(
        hostile: httpx.Client, name: str, why: str) -> None:
    page = hostile.get(f"/plan/{name}")
    assert page.status_code == 200
    assert "unreadable" in page.text and why in page.text, page.text[-1500:]
    for leaked in ("SECRET-FOLLOWED", "HUGE-READ", "BROKEN-READ"):
        assert leaked not in page.text


def test_malformed_plan_ids_never_become_paths(hostile: httpx.Client) -> None:
    for bad in ("..%2F..%2Fetc", "a..b", "%2Fetc%2Fpasswd", ".hidden", "a" * 80, "nope"):
        assert hostile.get(f"/plan/{bad}").status_code == 404, bad


def test_an_edge_that_skips_a_column_runs_between_the_rows_not_through_a_node() -> None:
    """a -> b -> c and a -> c: drawn straight, a -> c crossed b's box (seen in the screenshot)."""
    from choir.view.plans import NODE_H, NODE_W, ItemView, layout

    def item(name: str, *deps: str) -> ItemView:
        return ItemView(name, "merged", "", "", 1, "", "", (), deps, 0)

    nodes, edges, _, _ = layout((item("a"), item("b", "a"), item("c", "b", "a")))
    box = {n.item.id: n for n in nodes}["b"]
    skip = {(e.dep, e.item): e for e in edges}[("a", "c")]
    points = [tuple(map(int, p.split(","))) for p in skip.points.split()]
    assert len(points) == 4
    for (x1, y1), (x2, y2) in zip(points, points[1:], strict=False):
        for t in (i / 50 for i in range(51)):  # no point of the route inside b's box
            x, y = x1 + (x2 - x1) * t, y1 + (y2 - y1) * t
            assert not (box.x <= x <= box.x + NODE_W and box.y <= y <= box.y + NODE_H), (x, y)
    straight = {(e.dep, e.item): e for e in edges}[("a", "b")]
    assert len(straight.points.split()) == 2
