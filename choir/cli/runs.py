"""``choir runs list`` and ``choir runs show RUN_ID``: inspect a run after the fact.

Everything shown is read back from what the run stored: the checkpoint of a ``choir run``
(status, attempts, the executor's log hash), the attestations minted for it (each names its
report and manifest by hash), the AHDB's verdicts on its work item, the artifact run folders,
and, for ``choir verify``, its session manifest at ``runs/{run_id}/manifest.json``. Nothing
is re-run, and no stored file is changed (the checkpoint database is opened read-only).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import click

from choir._core.terminal import plain_lines, shorten
from choir.cli._errors import EXIT_OK

OUTPUT_TAIL_LINES = 40
_EXITED = re.compile(rb"\[choir\] executor exited (-?\d+)")


def _saver(home: Path) -> Any:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.checkpoint.sqlite import SqliteSaver

    from choir.graph.state import checkpoint_types

    conn = sqlite3.connect(f"file:{home / 'checkpoints.sqlite'}?mode=ro", uri=True,
                           check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.serde = JsonPlusSerializer(allowed_msgpack_modules=checkpoint_types())
    return saver


def _loop_threads(home: Path) -> list[str]:
    from choir.config.store_url import database_url

    url = database_url(home)
    if url:  # checkpoints in Postgres (choir.graph.checkpoints)
        from choir.graph.checkpoints import pg_threads

        return pg_threads(url)
    path = home / "checkpoints.sqlite"
    if not path.is_file():
        return []
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        try:
            rows = conn.execute("SELECT DISTINCT thread_id FROM checkpoints "
                                "WHERE checkpoint_ns = ''").fetchall()
        except sqlite3.OperationalError:
            return []
    from choir.graph.checkpoints import run_threads

    return run_threads(sorted(str(r[0]) for r in rows))


def _loop_state(home: Path, run_id: str) -> tuple[dict[str, Any], str] | None:
    """The last checkpoint's values and time of a ``choir run``, or None."""
    if run_id not in _loop_threads(home):
        return None
    from choir.config.store_url import database_url

    url = database_url(home)
    if url:
        from choir.graph.checkpoints import pg_latest

        return pg_latest(url, run_id)
    saver = _saver(home)
    try:
        found = saver.get_tuple({"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
    finally:
        saver.conn.close()
    if found is None:
        return None
    return dict(found.checkpoint.get("channel_values") or {}), str(found.checkpoint.get("ts"))


def _loop_summary(run_id: str, values: dict[str, Any], ts: str) -> dict[str, Any]:
    item = values.get("work_item")
    repo = getattr(item, "repo", None)
    return {"run_id": run_id, "kind": "run", "status": values.get("status", "unknown"),
            "repo": str(repo) if repo else None,
            "work_item": getattr(item, "split_of", None) or getattr(item, "id", ""),
            "mood": values.get("mood", ""), "attempt": values.get("attempt", 0),
            "reason": values.get("reason", ""), "updated": ts}


def _pinned(home: Path) -> set[str] | None:
    """The key ids a session's seal is checked against, None when none is pinned yet: read
    without pinning (listing runs must not create a signing key)."""
    from choir.attest.keys import pinned_trust_root

    root = pinned_trust_root(home)
    return None if root is None else set(root.keys)


def list_runs() -> list[dict[str, Any]]:
    """Every ``choir run`` and ``choir verify`` stored under this CHOIR_HOME, newest first."""
    from choir._core.paths import choir_home
    from choir.evidence.artifacts import ArtifactStore
    from choir.verification.session import read_sealed_session

    home, store = choir_home(), ArtifactStore()
    trusted = _pinned(home)
    rows = []
    for run_id in _loop_threads(home):
        state = _loop_state(home, run_id)
        if state is not None:
            rows.append(_loop_summary(run_id, *state))
    for run_id in store.iter_runs():
        read = read_sealed_session(store.run_dir(run_id), trusted)
        if read is not None:  # its status is shown only with its seal's verdict
            session, seal = read
            rows.append({"run_id": run_id, "kind": "verify", "status": session["status"],
                         "seal": seal, "repo": session.get("repo"), "work_item": "",
                         "mood": session.get("mood", ""), "attempt": 1,
                         "reason": "", "updated": session.get("timestamp_end") or ""})
    from choir.team.state import list_plans

    for plan in list_plans():  # ``choir plan run``: one row per plan, its items in show
        rows.append({"run_id": plan["plan"], "kind": "plan", "status": plan["status"],
                     "repo": plan["repo"], "work_item": f"{len(plan['items'])} items",
                     "mood": "", "attempt": 1, "reason": "", "updated": plan.get("updated", "")})
    return sorted(rows, key=lambda r: str(r["updated"]), reverse=True)


def _attestations(att_ids: list[str], store: Any) -> list[dict[str, Any]]:
    from choir.attest import AttestationStore
    from choir.exceptions import IntegrityError

    atts, out = AttestationStore(), list[dict[str, Any]]()
    for att_id in att_ids:
        try:
            body = atts.get(att_id).body
        except (IntegrityError, OSError, ValueError) as exc:
            out.append({"id": att_id, "error": str(exc)[:200]})
            continue
        try:
            report = json.loads(store.read_bytes(body.report_hash, limit=4 << 20))
        except (OSError, ValueError, IntegrityError):
            report = None
        folder = store.run_dir(body.run_id)
        out.append({"id": att_id, "verifier": body.verifier, "run_id": body.run_id,
                    "result": body.result.value, "lens": body.lens, "mood": body.mood,
                    "report": report, "artifact_path": str(folder) if folder.is_dir() else None})
    return out


def _loop_attestation_ids(run_id: str) -> list[str]:
    """Attestations minted for a ``choir run``: their run ids are ``{run_id}[-part]-rN-...``."""
    from choir.attest import AttestationStore
    from choir.exceptions import IntegrityError

    mine = re.compile(rf"^{re.escape(run_id)}-(?:.+-)?r\d+-.+-\d+$")
    atts, found = AttestationStore(), []
    for att_id in atts.ids():
        try:
            att = atts.get(att_id)
        except (IntegrityError, OSError, ValueError):
            continue
        if mine.match(att.body.run_id):
            found.append((att.body.started_at, att_id))
    return [att_id for _, att_id in sorted(found)]


def _executor(store: Any, digest: str | None, values: dict[str, Any],
              with_output: bool = True) -> dict[str, Any]:
    """The executor's last attempt: exit code, timed out, isolation (recorded in the run's
    state), and for a person its output tail, read from the artifact store."""
    recorded = {"timed_out": values.get("executor_timed_out"),
                "isolation": values.get("executor_isolation")}
    out = _executor_output(store, digest) if with_output else {
        "exit_code": None, "output_hash": digest}
    if values.get("executor_exit") is not None:
        out["exit_code"] = values["executor_exit"]
    return {**out, **recorded}


def _executor_output(store: Any, digest: str | None) -> dict[str, Any]:
    if not digest:
        return {"exit_code": None, "output_tail": "", "output_hash": None}
    try:
        raw = store.read_bytes(digest, limit=16 << 20)
    except (OSError, ValueError):
        return {"exit_code": None, "output_tail": "(output not readable)", "output_hash": digest}
    codes = _EXITED.findall(raw)
    tail = plain_lines(raw.decode("utf-8", "replace")).splitlines()[-OUTPUT_TAIL_LINES:]
    return {"exit_code": int(codes[-1]) if codes else None, "output_tail": "\n".join(tail),
            "output_hash": digest}


def show_run(run_id: str, with_output: bool = True) -> dict[str, Any]:
    """All that is stored about one run (``with_output``: the executor's output tail too, for
    a person; ``choir run --json`` leaves it out, its readers are scripts).

    Raises:
        UserError: no ``choir run`` or ``choir verify`` with this id is stored here.
    """
    from choir._core.paths import choir_home
    from choir.ahdb import open_ahdb
    from choir.evidence.artifacts import ArtifactStore
    from choir.exceptions import UserError

    home, store = choir_home(), ArtifactStore()
    store.run_dir(run_id)  # a malformed id is a usage error before anything is read
    state = _loop_state(home, run_id)
    if state is not None:
        values, ts = state
        out = _loop_summary(run_id, values, ts)
        out["events"] = list(values.get("events", []))
        out["executor"] = _executor(store, values.get("executor_output"), values, with_output)
        out["attestations"] = _attestations(_loop_attestation_ids(run_id), store)
        item = out["work_item"]
        out["verdicts"] = [atom.model_dump(mode="json", include={
            "id", "kind", "status", "claim", "tree_hash", "attestations", "updated_at"})
            for atom in open_ahdb(home).atoms(work_item=item)] if item else []
        return out
    from choir.verification.session import read_sealed_session

    read = read_sealed_session(store.run_dir(run_id), _pinned(home))
    if read is None:
        raise UserError(f"no run {run_id!r} under {home}\n  fix: `choir runs list` shows them")
    session, seal = read
    return {"run_id": run_id, "kind": "verify", "status": session["status"], "seal": seal,
            "repo": session.get("repo"), "mood": session.get("mood", ""),
            "updated": session.get("timestamp_end"),
            "manifest_path": str(store.run_dir(run_id) / "manifest.json"),
            "commands_executed": session["commands_executed"],
            "platform": session["platform"],
            "attestations": _attestations(list(session["attestations"]), store),
            "crashed": list(session.get("crashed", [])),
            "verdicts": [], "executor": None}


@click.group()
def runs() -> None:
    """Inspect past runs of `choir run` and `choir verify`."""


@runs.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array on stdout.")
@click.option("--repo", type=click.Path(path_type=Path), default=None,
              help="Only the runs of this repo.")
def list_command(as_json: bool, repo: Path | None) -> int:
    """Every stored run, newest first."""
    rows = list_runs()
    if repo is not None:
        wanted = str(repo.expanduser().resolve())
        rows = [r for r in rows if r.get("repo") == wanted]
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return EXIT_OK
    if not rows:
        click.echo("no runs yet: `choir verify` or `choir run WORKITEM.yaml` makes one")
    for r in rows:
        status = str(r["status"]).upper()
        if r.get("seal", "valid") != "valid":  # a session record no trusted key vouches for
            status = f"{status} (SEAL {str(r['seal']).split(':')[0]})"
        click.echo(f"{r['run_id']}  {r['kind']:6}  {status:17}  "
                   f"{r['work_item'] or '-'}  mood {r['mood'] or '-'}  attempt {r['attempt']}  "
                   f"{str(r['updated'])[:19]}  {plain_lines(r.get('repo') or '-')}")
    return EXIT_OK


@runs.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def show_command(run_id: str, as_json: bool) -> int:
    """One run: reports, verdicts, attestations, artifact paths, the executor's output."""
    from choir.team.state import load_state

    plan = load_state(run_id)
    if plan is not None:
        if as_json:
            click.echo(json.dumps(plan, indent=2, sort_keys=True))
            return EXIT_OK
        click.echo(f"plan {run_id}  {str(plan['status']).upper()}  integration "
                   f"{plan['integration'][:12]}  repo {plain_lines(plan['repo'])}")
        for item_id, row in plan["items"].items():
            click.echo(f"  {item_id:20} {row['state']:8} attempt {row['attempt']}  "
                       f"{row['run_id'] or '-'}  {shorten(plain_lines(str(row['last'])), 80)}")
        return EXIT_OK
    data = show_run(run_id)
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return EXIT_OK
    click.echo(f"{data['kind']} {run_id}  {str(data['status']).upper()}  mood {data['mood']}"
               + (f"  work item {data['work_item']}  attempt {data['attempt']}"
                  if data["kind"] == "run" else ""))
    if data.get("repo"):
        click.echo(f"repo: {plain_lines(str(data['repo']))}")
    if data.get("reason"):
        click.echo(f"reason: {plain_lines(str(data['reason']))}")
    if data.get("manifest_path"):
        click.echo(f"manifest: {data['manifest_path']}")
    if data.get("seal", "valid") != "valid":  # a session's record nobody vouches for
        click.echo(f"seal: {plain_lines(str(data['seal']))}: the status above is not "
                   "vouched for (`choir audit` names what differs)")
    for att in data["attestations"]:
        report = att.get("report") or {}
        summary = shorten(plain_lines(str(report.get("summary", ""))), 120)
        click.echo(f"  {att.get('verifier', '?'):14} {att.get('result', 'ERROR'):12} "
                   f"attestation {att['id'][:16]}  {summary}")
        for sig in report.get("failure_signatures", [])[:10]:
            where = f"  ({sig['location']})" if sig.get("location") else ""
            click.echo(f"      - {plain_lines(str(sig.get('test_id') or sig['kind']))}{where}")
        if att.get("artifact_path"):
            click.echo(f"      artifacts: {att['artifact_path']}")
    for crashed in data.get("crashed", []):
        click.echo(f"  {plain_lines(str(crashed))}: crashed inside Choir (INCONCLUSIVE, "
                   "nothing attested)")
    for atom in data.get("verdicts", []):
        click.echo(f"verdict: {atom['kind']} {atom['status']}  {plain_lines(atom['claim'])}")
    executor = data.get("executor")
    if executor:
        click.echo(f"executor exit code: {executor['exit_code']}  "
                   f"(output {executor['output_hash']})")
        if executor["output_tail"]:
            click.echo(f"--- last {OUTPUT_TAIL_LINES} lines of the executor's output ---")
            click.echo(executor["output_tail"])
    return EXIT_OK
