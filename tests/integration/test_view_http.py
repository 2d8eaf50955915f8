"""``choir view`` over plain HTTP (no browser): the token, the Host check, the security
headers, escaping and bounds of hostile artifacts, server-side citation checks, paging, and
that viewing writes nothing. The home holds real runs made by Choir (``tests.viewhome``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from choir.attest import trusted_key_ids, verify_dsse
from choir.evidence.artifacts import ArtifactStore
from choir.view.text import LINE_MAX
from tests import forked
from tests.viewhome import (
    LONG_LINE,
    env_for,
    flip_byte,
    make_home,
    session_attestations,
    synthetic_runs,
    view_server,
)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_home(tmp_path_factory.mktemp("view"))


@pytest.fixture(scope="module")
def server(made: dict[str, str]) -> Iterator[object]:
    with view_server(Path(made["home"])) as s:
        yield s


@pytest.fixture()
def client(server: object) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, follow_redirects=False, timeout=30) as c:  # type: ignore[attr-defined]
        answer = c.get(f"/?token={server.token}")  # type: ignore[attr-defined]
        assert answer.status_code == 303
        assert answer.headers["location"] == urlsplit(server.base).path + "/"  # type: ignore[attr-defined]
        yield c


def test_every_request_without_this_launchs_token_is_refused(server: object) -> None:
    base, token = server.base, server.token  # type: ignore[attr-defined]
    with httpx.Client(base_url=base, follow_redirects=False, timeout=30) as c:
        for path in ("/", "/ahdb", "/audit", "/static/view.css", "/run/x"):
            assert c.get(path).status_code == 403
        wrong = token[:-1] + ("y" if token.endswith("x") else "x")  # one character off
        assert c.get(f"/?token={wrong}").status_code == 403
        assert c.get("/", headers={"cookie": f"choir_view_{server.port}=wrong"}).status_code \
            == 403  # type: ignore[attr-defined]
        # a rebound DNS name reaches the port with the right cookie, and is still refused
        c.get(f"/?token={token}")
        assert c.get("/").status_code == 200
        assert c.get("/", headers={"host": f"evil.example:{server.port}"}).status_code \
            == 403  # type: ignore[attr-defined]
        cookie = c.get(f"/?token={token}").headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_every_page_forbids_scripts_and_framing(client: httpx.Client,
                                                made: dict[str, str]) -> None:
    for path in ("/", f"/run/{made['run']}", f"/run/{made['verify']}", "/ahdb", "/audit",
                 "/run/no-such-run", "/artifact/" + "0" * 64, "/static/view.css"):
        answer = client.get(path)
        assert answer.status_code in (200, 404), path
        csp = answer.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script" not in csp and \
            "frame-ancestors 'none'" in csp, path
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"


def test_a_hostile_artifact_is_shown_inert_and_bounded(client: httpx.Client,
                                                       made: dict[str, str]) -> None:
    hostile = session_attestations(Path(made["home"]), made["verify"])["hostile"]
    log = ArtifactStore(Path(made["home"]) / "artifacts").path_of(
        hostile.body.artifacts["logs/combined.log"])  # type: ignore[attr-defined]
    assert log.stat().st_size > LONG_LINE  # the stored log really holds the long line
    page = client.get(f"/artifact/{log.parent.name}{log.name}")
    assert page.status_code == 200
    html = page.text
    assert "&lt;script&gt;document.title=" in html and "&lt;img src=x onerror" in html
    assert "<script" not in html and "<img" not in html
    assert "\x1b" not in html and "\x07" not in html and "\u202e" not in html
    assert "RED" in html and "click" in html  # the text stays, the sequences go
    assert "line cut" in html and len(page.content) < 4 * LINE_MAX + 20_000
    assert "after the long line" in html
    raw = client.get(f"/artifact/{log.parent.name}{log.name}/raw")
    assert raw.headers["content-type"].startswith("text/plain")
    assert "\x1b" not in raw.text and len(raw.content) < 2 * LINE_MAX


def test_a_citation_is_checked_against_the_stored_bytes(client: httpx.Client,
                                                       made: dict[str, str]) -> None:
    unit = session_attestations(Path(made["home"]), made["verify"])["unit"]
    report = client.get(f"/report/{unit.body.report_hash}")  # type: ignore[attr-defined]
    assert "::test_add" in report.text
    link = report.text.split('class="citation" href="', 1)[1].split('"', 1)[0]
    link = link.replace("&amp;", "&").split("#", 1)[0]
    root = urlsplit(str(client.base_url)).path  # every link names the viewer's prefix
    assert link.startswith(root + "artifact/"), link
    link = link.removeprefix(root)
    good = client.get(link)
    assert "matches the stored bytes" in good.text and 'class="line cited"' in good.text
    forged = link[:-64] + "f" * 64  # a report whose span hash does not fit its log
    assert "DOES NOT MATCH the stored bytes" in client.get(forged).text


def test_an_attestation_is_rechecked_on_every_view(client: httpx.Client,
                                                   made: dict[str, str],
                                                   tmp_path: Path) -> None:
    unit = session_attestations(Path(made["home"]), made["verify"])["unit"]
    page = client.get(f"/attestation/{unit.id}")  # type: ignore[attr-defined]
    assert 'id="att-status">VALID' in page.text
    dsse = client.get(f"/attestation/{unit.id}/dsse.json")  # type: ignore[attr-defined]
    assert dsse.status_code == 200 and "attachment" in dsse.headers["content-disposition"]
    assert verify_dsse(dsse.json(), unit.public_key)  # type: ignore[attr-defined]
    body = json.loads(client.get(f"/attestation/{unit.id}/attestation.json").content)  # type: ignore[attr-defined]
    assert body["id"] == unit.id  # type: ignore[attr-defined]
    folder = client.get(f"/run/{unit.body.run_id}")  # type: ignore[attr-defined]
    assert folder.status_code == 200 and "sealed manifest" in folder.text


def test_malformed_ids_never_become_paths(client: httpx.Client) -> None:
    for path in ("/run/..%2F..%2Fetc", "/run/.hidden", "/artifact/../../etc/passwd",
                 "/artifact/abc", "/attestation/" + "g" * 64, "/report/zz",
                 "/attestation/" + "0" * 64 + "/dsse.json"):
        answer = client.get(path)
        assert answer.status_code == 404, path
        assert "root:" not in answer.text


def test_the_run_list_pages_and_filters(tmp_path: Path) -> None:
    home = tmp_path / "many"
    synthetic_runs(home, home / "artifacts", 130)
    with view_server(home) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        first = c.get("/")
        assert "130 shown" in first.text and "page 1 of 3" in first.text
        assert first.text.count('class="run-link"') == 50
        last = c.get("/?page=3")
        assert last.text.count('class="run-link"') == 30 and "verify-000001" in last.text
        fails = c.get("/?kind=verify&status=FAIL")
        assert "35 shown" in fails.text and "verify-000001" not in fails.text
        item = c.get("/?work_item=item-1")
        assert "8 shown" in item.text
        assert 'class="run-link"' not in c.get("/?query=%3Cscript%3E").text
        assert "&lt;script&gt;" in c.get("/?query=%3Cscript%3E").text


def test_viewing_writes_nothing_not_even_a_key(tmp_path: Path, made: dict[str, str]) -> None:
    """A home with evidence but no key and no pin: pinning or creating a key is a write the
    viewer must never make (it would also make it a process that holds the key). Its one
    write is the empty owner-only ``keys/`` folder its mask is mounted on, so a key a run
    makes while it runs is never in its view."""
    home = tmp_path / "home"
    shutil.copytree(made["home"], home)
    shutil.rmtree(home / "keys")
    (home / "trusted_keys").unlink()

    def snapshot() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in home.rglob("*")
                if p.is_file() and "-wal" not in p.name and "-shm" not in p.name}

    before = snapshot()
    unit = session_attestations(home, made["verify"])["unit"]
    with view_server(home) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        for path in ("/", f"/run/{made['run']}", f"/run/{made['verify']}", "/ahdb", "/audit",
                     f"/attestation/{unit.id}", f"/report/{unit.body.report_hash}"):  # type: ignore[attr-defined]
            assert c.get(path).status_code == 200, path
        assert "no key pinned" in c.get(f"/attestation/{unit.id}").text  # type: ignore[attr-defined]
        assert c.get(f"/attestation/{unit.id}/dsse.json").status_code == 404  # type: ignore[attr-defined]
    assert snapshot() == before
    assert (home / "keys").is_dir() and not any((home / "keys").iterdir())
    assert (home / "keys").stat().st_mode & 0o777 == 0o700
    assert not (home / "trusted_keys").exists()


def test_the_audit_page_never_derives_an_old_homes_tables(tmp_path: Path,
                                                          made: dict[str, str]) -> None:
    """``GET /audit`` ran the full audit, whose store derives the AHDB's tables again when
    its schema is older: on a home with a pinned key, one page view rewrote the database
    (``user_version`` 0 -> 2; a review's finding, failing on the old code). The page says
    what to run instead, and the database is left as it was."""
    import sqlite3

    home = tmp_path / "home"
    shutil.copytree(made["home"], home)
    db = home / "ahdb.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 0")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    with view_server(home) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        page = c.get("/audit")
        assert page.status_code == 200 and "choir audit" in page.text, page.text[-500:]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    conn.close()
    assert db.read_bytes() == before


def test_an_attestation_reads_invalid_after_a_byte_flip_in_its_object(
        tmp_path: Path, made: dict[str, str]) -> None:
    home = tmp_path / "home"
    shutil.copytree(made["home"], home)
    unit = session_attestations(home, made["verify"])["unit"]
    flip_byte(ArtifactStore(home / "artifacts").path_of(unit.body.report_hash), 10)  # type: ignore[attr-defined]
    with view_server(home) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        page = c.get(f"/attestation/{unit.id}").text  # type: ignore[attr-defined]
        assert 'id="att-status">INVALID' in page and "MISSING OR ALTERED" in page
        assert "object_hash" in page
        assert "ALTERED" in c.get(f"/report/{unit.body.report_hash}").text  # type: ignore[attr-defined]
        audit = c.get("/audit").text
        root = urlsplit(s.base).path
        assert "VIOLATION" in audit and f'href="{root}/attestation/{unit.id}"' in audit  # type: ignore[attr-defined]


def test_a_missing_extra_fails_with_the_pip_command_and_help_stays_light(
        made: dict[str, str]) -> None:
    env = env_for(Path(made["home"]))
    blocked = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['starlette'] = None\n"
         "from choir.cli import main; main(['view'])"],
        env=env, capture_output=True, text=True, timeout=60)
    assert blocked.returncode == 2
    assert "pip install 'choir[view]'" in blocked.stderr
    light = subprocess.run(
        [sys.executable, "-c", "import sys, choir\nfrom choir.cli import main\n"
         "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
         "print(sorted(m for m in ('starlette', 'uvicorn', 'jinja2', 'choir.view') "
         "if m in sys.modules))"],
        env=dict(env, PYTHONDONTWRITEBYTECODE="1"), capture_output=True, text=True,
        timeout=60)
    assert light.stdout.strip().endswith("[]"), light.stdout[-500:]
    assert "view" in light.stdout



@pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes
def test_a_postgres_store_is_read_through_the_same_pages(tmp_path: Path, pg_url: str) -> None:
    """AHDB atoms and attestations live in Postgres: the local attestation files are removed,
    so every page below reads the shared store."""
    shared = {"CHOIR_DATABASE_URL": pg_url}
    made = make_home(tmp_path, shared)
    home = Path(made["home"])
    assert not (home / "ahdb.sqlite").exists()
    unit = session_attestations(home, made["verify"])["unit"]
    for local in (home / "attestations").glob("*.json"):
        local.chmod(0o644)
        local.unlink()
    with view_server(home, shared) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        atoms = c.get("/ahdb?work_item=fix-add").text
        assert "PROMOTED" in atoms and "HYPOTHESIZE" in atoms
        page = c.get(f"/attestation/{unit.id}").text  # type: ignore[attr-defined]
        assert 'id="att-status">VALID' in page
        assert made["run"] in c.get("/").text


def test_the_viewer_writes_nothing_to_a_postgres_database(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 17c: on Postgres the viewer opened a full AHDB on a GET, whose constructor
    created Choir's whole schema in a database it only viewed (a mistyped name populated),
    and derived the tables again under the write lock when their version was behind (which
    a runner granted UPDATE on ``choir_meta`` can arrange). It asks with reads only."""
    import psycopg
    from starlette.testclient import TestClient

    from choir.ahdb import open_ahdb
    from choir.ahdb.postgres import close_connections
    from choir.view.serve import build

    monkeypatch.setenv("CHOIR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CHOIR_DATABASE_URL", pg_url)

    def tables() -> int:
        with psycopg.connect(pg_url) as conn:
            return int(conn.execute("SELECT count(*) FROM pg_tables "
                                    "WHERE schemaname = 'public'").fetchone()[0])

    def get(path: str) -> str:
        app, _ = build(tmp_path / "home", ArtifactStore().root, token="t" * 32, port=8126)
        with TestClient(app, base_url="http://127.0.0.1:8126") as client:
            return client.get(f"{path}?token={'t' * 32}").text

    get("/ahdb")
    assert tables() == 0  # an empty database stays empty
    open_ahdb()  # Choir's tables, as a run makes them
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE choir_meta SET value = 0 WHERE key = 'version'")
    close_connections(pg_url)
    assert 'id="ahdb-note"' in get("/ahdb")  # and says why it shows nothing
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT value FROM choir_meta WHERE key = 'version'"
                            ).fetchone()[0] == 0  # nothing derived again


@pytest.mark.skipif(os.geteuid() != 0, reason="the key check reads /proc/PID/root (root)")
def test_the_viewer_process_cannot_read_the_key_yet_signs_a_dsse_export(
        tmp_path: Path, made: dict[str, str]) -> None:
    """The viewer parses hostile bytes (logs, traces, plan records), so it runs confined like
    every such command: the key folder is an empty mask in its mount namespace, and a DSSE
    export is signed by the broker it started before confining itself. Watched failing before
    ``view`` joined the separated commands: ``/proc/PID/root`` showed the key file."""
    home = tmp_path / "home"
    shutil.copytree(made["home"], home)
    key = home / "keys" / "ed25519.key"
    assert key.is_file()
    unit = session_attestations(home, made["verify"])["unit"]
    with view_server(home) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        assert c.get("/").status_code == 200
        assert not Path(f"/proc/{s.proc.pid}/root{key}").exists(), "the viewer can read the key"
        assert os.listdir(f"/proc/{s.proc.pid}/root{key.parent}") == []
        answer = c.get(f"/attestation/{unit.id}/dsse.json")  # type: ignore[attr-defined]
        assert answer.status_code == 200, answer.text[-500:]
        assert verify_dsse(answer.json(), unit.public_key)  # type: ignore[attr-defined]


def test_a_session_record_rewritten_without_the_key_is_shown_as_unsealed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run list and a session's page show the status a record says only with its seal's
    verdict over the very bytes shown (``choir runs list`` does the same): a FAIL rewritten
    to PASS by someone with the user's rights, but not the key, reads "SEAL INVALID"."""
    home = tmp_path / "forged"
    monkeypatch.setenv("CHOIR_HOME", str(home))  # sealed by this home's own key
    synthetic_runs(home, home / "artifacts", 3, traced_every=0)  # 000000 is a FAIL
    trusted_key_ids(home)  # its key pinned, as every command that signs pins it
    forged = home / "artifacts" / "runs" / "verify-000000" / "manifest.json"
    forged.chmod(0o644)
    forged.write_text(forged.read_text().replace('"status": "FAIL"', '"status": "PASS"'))
    with view_server(home) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        rows = {row.split('class="run-link"')[1].split(">")[1].split("<")[0]: row
                for row in c.get("/?kind=verify").text.split("<tr>")[2:]}
        assert set(rows) == {"verify-000000", "verify-000001", "verify-000002"}
        assert "SEAL INVALID" in rows["verify-000000"] and "v-pass" in rows["verify-000000"]
        assert not any("SEAL" in rows[r] for r in ("verify-000001", "verify-000002"))
        page = c.get("/run/verify-000000").text
        assert "SEAL INVALID" in page and "not the sealed" in page
        assert "SEAL" not in c.get("/run/verify-000001").text


def test_the_token_redirect_never_leaves_the_viewer(server: object) -> None:
    """``//evil.example/x?token=T`` answered ``303 Location: //evil.example/x``: a browser
    takes that for another site (found by a review; it needed the launch's token)."""
    import socket

    where = urlsplit(server.base)  # type: ignore[attr-defined]
    with socket.create_connection((where.hostname, where.port), timeout=30) as conn:
        conn.sendall(f"GET {where.path}//evil.example/x?token={server.token} HTTP/1.1\r\n"  # type: ignore[attr-defined]
                     f"Host: {where.netloc}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    assert head.startswith("http/1.1 303"), head
    assert f"\r\nlocation: {where.path.lower()}/evil.example/x\r\n" in head + "\r\n", head


def test_a_planted_or_revoked_attestation_is_never_exported(
        tmp_path: Path, made: dict[str, str]) -> None:
    """Review 21, F1: ``choir attest show --in-toto`` and the viewer's ``dsse.json`` had the
    home's trusted key sign a statement around whatever file was stored: a FAIL flipped to
    PASS (id recomputed, signature now invalid), or one a revoked key signed. Both refuse,
    naming why; a genuine one still exports."""
    from choir._core.canonical import blake3_hex, canonical_json
    from choir.attest import signed_bytes
    from choir.models import Result

    home = tmp_path / "home"
    shutil.copytree(made["home"], home)
    unit = session_attestations(home, made["verify"])["unit"]
    flipped = Result.FAIL if unit.body.result is Result.PASS else Result.PASS  # type: ignore[attr-defined]
    body = unit.body.model_copy(update={"result": flipped})  # type: ignore[attr-defined]
    forged = unit.model_copy(update={"body": body, "id": blake3_hex(signed_bytes(body))})  # type: ignore[attr-defined]
    (home / "attestations" / f"{forged.id}.json").write_bytes(canonical_json(forged))

    def show(att_id: str) -> subprocess.CompletedProcess[str]:
        return forked.run([sys.executable, "-m", "choir", "attest", "show", att_id,
                           "--in-toto"], env=env_for(home), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)

    refused = show(forged.id)
    assert refused.returncode == 1 and refused.stdout == "", refused.stdout[-500:]
    assert "attestation_signature" in refused.stderr and "Traceback" not in refused.stderr
    assert show(unit.id).returncode == 0  # type: ignore[attr-defined]
    with view_server(home) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        answer = c.get(f"/attestation/{forged.id}/dsse.json")
        assert answer.status_code == 409 and "attestation_signature" in answer.text
        assert c.get(f"/attestation/{unit.id}/dsse.json").status_code == 200  # type: ignore[attr-defined]
    (home / "revoked_keys").write_text(f"{unit.signer_key_id}\n")  # type: ignore[attr-defined]
    revoked = show(unit.id)  # type: ignore[attr-defined]
    assert revoked.returncode == 1 and "key_revoked" in revoked.stderr, revoked.stderr[-500:]
    with view_server(home) as s, httpx.Client(base_url=s.base, timeout=30) as c:
        c.get(f"/?token={s.token}")
        answer = c.get(f"/attestation/{unit.id}/dsse.json")  # type: ignore[attr-defined]
        assert answer.status_code == 409 and "key_revoked" in answer.text
