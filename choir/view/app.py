"""The viewer's pages: Starlette routes rendering Jinja2 templates, all read-only.

Every value from a store reaches the browser through a template with autoescape on; artifact
text is also stripped of control sequences first (``choir.view.text``). Ids in URLs are
checked by the stores themselves (a blake3 digest, a run id), so no path is built from
unchecked input. A page never trusts an earlier view: an attestation's status, a report's
hash and a citation's span hash are re-derived on each request.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from choir._core.canonical import canonical_json, is_hash
from choir.ahdb.rules import dead_asserts
from choir.exceptions import ChoirError, IntegrityError, NotFoundError, UserError
from choir.view.index import RunIndex, RunRow
from choir.view.plans import STATES, plan_view
from choir.view.reads import (
    Stores,
    atoms_and_demotions,
    attestation_rows,
    attestation_view,
    load_report,
    plan_events,
    tables_behind,
    verifier_run,
)
from choir.view.text import PAGE_LINES, plain_page, window
from choir.view.timeline import has_trace, run_timeline, session

HERE = Path(__file__).parent
PER_PAGE = 50
_HEX = re.compile(r"^([0-9a-f]{64})")


def _int(request: Request, name: str, default: int) -> int:
    try:
        return int(request.query_params.get(name, default))
    except ValueError:
        return default


class Viewer:
    """The pages of one home; ``app`` is the ASGI application (without the token guard).

    ``root``: the path prefix the guard serves the app under (``/<prefix>``, or empty);
    every link a page or a violation's row makes starts with it, since a page outside it
    is a 404 and the token's cookie is sent under it only.
    """

    def __init__(self, stores: Stores, root: str = "") -> None:
        self.stores, self.root = stores, root
        self.index = RunIndex(stores.home, stores.artifacts.root)
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"),
                               autoescape=select_autoescape(default=True, default_for_string=True),
                               auto_reload=False)
        self.env.globals["short"] = lambda v, n=12: str(v or "")[:n]
        self.env.globals["root"] = root
        self.app = Starlette(routes=[
            Route("/", self.runs), Route("/run/{run_id}", self.run),
            Route("/report/{digest}", self.report), Route("/artifact/{digest}", self.artifact),
            Route("/artifact/{digest}/raw", self.artifact_raw),
            Route("/attestation/{att_id}", self.attestation),
            Route("/attestation/{att_id}/attestation.json", self.attestation_json),
            Route("/attestation/{att_id}/dsse.json", self.attestation_dsse),
            Route("/plan/{plan_id}", self.plan),
            Route("/ahdb", self.ahdb), Route("/audit", self.audit),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ], exception_handlers={ChoirError: self._error})

    def page(self, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(name).render(**ctx), status_code=status)

    async def _error(self, request: Request, exc: Exception) -> Response:
        status = 404 if isinstance(exc, (NotFoundError, UserError, IntegrityError)) else 500
        return self.page("error.html", status, title="not found" if status == 404 else "error",
                         message=str(exc)[:500])

    async def runs(self, request: Request) -> HTMLResponse:
        q = request.query_params
        filters = {k: q.get(k, "")[:200] for k in ("kind", "status", "work_item", "query")}
        rows = self.index.select(**filters)
        pages = max(1, -(-len(rows) // PER_PAGE))
        page = min(max(1, _int(request, "page", 1)), pages)
        shown = [self._sealed(row) for row in rows[(page - 1) * PER_PAGE:page * PER_PAGE]]
        return self.page("runs.html", title="runs", rows=shown, total=len(rows), page=page,
                         pages=pages, filters=filters, work_items=self.index.work_items())

    def _sealed(self, row: RunRow) -> RunRow:
        """A verify session's row as its record says now, with its seal's verdict over those
        very bytes (the index read the status once, unchecked, to sort and filter; checking
        every seal there costs 0.14 ms a session, 1.4 s at ten thousand): a record rewritten
        by someone without the key reads ``SEAL INVALID``, as in ``choir runs list``."""
        if row.kind != "verify":
            return row
        found = session(self.stores, row.run_id)
        if found is None:
            return replace(row, status="unreadable")
        return replace(row, status=str(found[0].get("status") or ""), seal=found[1])

    async def run(self, request: Request) -> HTMLResponse:
        run_id = request.path_params["run_id"]
        self.stores.artifacts.run_dir(run_id)  # malformed: UserError, a 404
        if has_trace(self.stores, run_id):
            timeline = await asyncio.to_thread(run_timeline, self.stores, run_id)
            return self.page("run.html", title=f"run {run_id}", t=timeline)
        found = session(self.stores, run_id)
        if found is None:
            sealed = await asyncio.to_thread(verifier_run, self.stores, run_id)
            if sealed is None:
                raise NotFoundError(f"no run {run_id!r} is stored here")
            return self.page("verifier_run.html", title=f"verifier run {run_id}",
                             m=sealed[0], digest=sealed[1], run_id=run_id)
        record, seal = found
        atts = await asyncio.to_thread(attestation_rows, self.stores, record.get("attestations"))
        return self.page("session.html", title=f"verify {run_id}", s=record, seal=seal,
                         run_id=run_id, atts=atts)

    async def plan(self, request: Request) -> HTMLResponse:
        """A team plan: its items with their states and runs, the dependency graph drawn on
        the server, the integration rounds and promotions."""
        view = await asyncio.to_thread(plan_view, self.stores.home,
                                       request.path_params["plan_id"])
        rounds = await asyncio.to_thread(plan_events, self.stores, view.plan_id)
        return self.page("plan.html", title=f"plan {view.plan_id}", p=view, states=STATES,
                         rounds=rounds)

    async def report(self, request: Request) -> HTMLResponse:
        digest = request.path_params["digest"]
        self.stores.artifacts.path_of(digest)  # not a digest: IntegrityError, a 404
        report, intact, error = await asyncio.to_thread(load_report, self.stores, digest)
        return self.page("report.html", title="report", digest=digest, r=report,
                         intact=intact, error=error)

    async def artifact(self, request: Request) -> HTMLResponse:
        digest = request.path_params["digest"]
        cite, span = None, request.query_params.get("span")
        first, last = _int(request, "from", 0), _int(request, "to", 0)
        if 1 <= first <= last:
            cite = (first, last)
        start = _int(request, "start", max(1, first - 5) if cite else 1)
        win = await asyncio.to_thread(window, self.stores.artifacts, digest, start=start,
                                      cite=cite, span_hash=span if span and is_hash(span)
                                      else None)
        return self.page("artifact.html", title=f"artifact {digest[:12]}", w=win,
                         page_lines=PAGE_LINES, span_given=span)

    async def artifact_raw(self, request: Request) -> PlainTextResponse:
        text, more = await asyncio.to_thread(plain_page, self.stores.artifacts,
                                             request.path_params["digest"],
                                             start=_int(request, "start", 1))
        return PlainTextResponse(text, headers={"x-choir-more-lines": "1" if more else "0"})

    async def attestation(self, request: Request) -> HTMLResponse:
        view = await asyncio.to_thread(attestation_view, self.stores,
                                       request.path_params["att_id"])
        return self.page("attestation.html", title=f"attestation {view.att_id[:12]}", a=view)

    async def attestation_json(self, request: Request) -> Response:
        att = self.stores.attestations.get(request.path_params["att_id"])
        return _download(canonical_json(att), f"{att.id}.json")

    async def attestation_dsse(self, request: Request) -> Response:
        """The in-toto/DSSE export, signed by the broker ``choir view`` started before it hid
        the key folder from itself (only when the home had a key: the viewer makes none).
        Only an attestation that verifies under the pinned keys is exported (``to_dsse``); the
        pin is read, never made here (pinning is a write)."""
        from choir.attest import to_dsse
        from choir.attest.keys import pinned_trust_root
        from choir.trusted import broker_started, signer

        att = self.stores.attestations.get(request.path_params["att_id"])  # unknown: 404
        if not broker_started():
            raise NotFoundError("no signing key on this home when choir view started: the "
                                "DSSE envelope cannot be signed here (the attestation itself "
                                "is signed: download it)")
        try:
            root = pinned_trust_root(self.stores.home)
            if root is None:
                raise IntegrityError("no key is pinned on this home yet, so no attestation "
                                     "can be vouched for: run `choir audit` to pin it")
            envelope = await asyncio.to_thread(to_dsse, att, signer(), root=root,
                                               artifacts=self.stores.artifacts)
        except ChoirError as exc:  # not verified, refused by the broker, a bad pin: 409
            return self.page("error.html", 409, title="export refused", message=str(exc)[-500:])
        return _download(json.dumps(envelope, indent=2, sort_keys=True).encode(),
                         f"{att.id}.dsse.json")

    async def ahdb(self, request: Request) -> HTMLResponse:
        work_item = request.query_params.get("work_item", "")[:200]
        atoms, demotions = await asyncio.to_thread(atoms_and_demotions, self.stores, work_item)
        # a shared database whose tables are behind (or absent) is not read: say so, never
        # an empty page that reads as "no atoms" (review 17e)
        behind = await asyncio.to_thread(tables_behind, self.stores)
        return self.page("ahdb.html", title="AHDB", atoms=atoms, demotions=demotions,
                         work_item=work_item, dead=dead_asserts(atoms), note=(
                             "this home's AHDB tables are missing or predate the current "
                             "schema: run `choir audit` (it derives them) to see its atoms"
                             if behind else ""))

    async def audit(self, request: Request) -> HTMLResponse:
        keys, source = self.stores.trusted_keys()
        if keys is None:
            return self.page("audit.html", title="audit", result=None, links={},
                             note="no key is pinned on this home yet: `choir audit` pins it")
        if await asyncio.to_thread(tables_behind, self.stores):
            return self.page("audit.html", title="audit", result=None, links={},
                             note="this home's AHDB predates the current schema: run `choir "
                                  "audit` once (it derives the tables again, a write the "
                                  "viewer never makes)")
        from choir.audit import audit

        result = await asyncio.to_thread(audit, home=self.stores.home,
                                         artifacts_root=self.stores.artifacts.root)
        links = {v.object: self.object_link(v.object) for v in result.violations}
        return self.page("audit.html", title="audit", result=result, links=links,
                         note=f"trusted keys from {source}")

    def object_link(self, obj: str) -> str | None:
        """The page of the object a violation names (an attestation, artifact or run)."""
        m = _HEX.match(obj)
        if m and m.group(1) in self.stores.attestations:
            return f"{self.root}/attestation/{m.group(1)}"
        if m and self.stores.artifacts.exists(m.group(1)):
            return f"{self.root}/artifact/{m.group(1)}"
        if obj.startswith("ahdb"):
            return f"{self.root}/ahdb"
        head = re.split(r"[/:]", obj, maxsplit=1)[0]
        try:
            folder = self.stores.artifacts.run_dir(head)
        except UserError:
            return None
        if folder.is_dir() or has_trace(self.stores, head):
            return f"{self.root}/run/{head}"
        return None


def _download(data: bytes, name: str) -> Response:
    return Response(data, media_type="application/json",
                    headers={"content-disposition": f'attachment; filename="{name}"'})


def dumps(value: Any) -> str:
    return json.dumps(value, indent=1, default=str, sort_keys=True)
