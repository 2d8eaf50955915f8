"""OpenTelemetry through the real CLI in its own process: one real OTLP/HTTP export to a
loopback receiver, a collector that is down or hangs, the missing extra, and no import cost
while off."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.otelspans import Receiver
from tests.workitems import PY, STEP_PY

pytestmark = pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes

pytest.importorskip("opentelemetry.sdk")

CANARY = "CANARY-otel-3b71-output-must-stay-home"


def sandbox() -> str:
    return "bwrap" if shutil.which("bwrap") else "local"


def repo(path: Path) -> Path:
    path.mkdir()
    (path / "loud.py").write_text(f"print({CANARY!r})\n")
    (path / "choir.yaml").write_text(
        "verifiers:\n"
        "  loud:\n    kind: unit_tests\n    steps:\n"
        f"      - {{name: shout, command: {STEP_PY} loud.py}}\n"
        "  quiet:\n    kind: unit_tests\n    steps:\n"
        "      - {name: ok, command: 'true'}\n")
    return path


def verify(path: Path, *extra: str, env: dict[str, str] | None = None,
           python: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([PY, *python, "-m", "choir", "verify", "--repo", str(path), "--json",
                           "--sandbox", sandbox(), *extra], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)
    return proc, time.monotonic() - started


def test_spans_arrive_at_a_real_otlp_http_endpoint(tmp_path: Path) -> None:
    with Receiver() as receiver:
        proc, _ = verify(repo(tmp_path / "repo"), "--otel",
                         env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                              "OTEL_SERVICE_NAME": "choir-ci"})
        received = receiver.spans()
    assert proc.returncode == 0, proc.stderr
    contract = json.loads(proc.stdout)
    names = sorted(span.name for _, span in received)
    assert names == ["choir.attest", "choir.attest", "choir.green_thread",
                     "choir.green_thread", "choir.round", "choir.verify"]
    assert {resource["service.name"] for resource, _ in received} == {"choir-ci"}
    by_id = {span.span_id: span for _, span in received}
    [root] = [s for _, s in received if s.name == "choir.verify"]
    [rnd] = [s for _, s in received if s.name == "choir.round"]
    assert not root.parent_span_id and rnd.parent_span_id == root.span_id
    for _, span in received:
        attrs = {a.key: a.value for a in span.attributes}
        if span.name == "choir.green_thread":
            assert span.parent_span_id == rnd.span_id
            assert attrs["choir.verdict"].string_value == "PASS"
            assert attrs["choir.sandbox"].string_value == sandbox()
        if span.name == "choir.attest":
            assert by_id[span.parent_span_id].name == "choir.green_thread"
            assert attrs["choir.attestation.id"].string_value in contract["attestations"]
        if span.name == "choir.verify":
            assert attrs["choir.run_id"].string_value == contract["run_id"]
    assert CANARY not in b"".join(receiver.bodies).decode("latin-1")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_collector_that_is_down_or_hangs_changes_nothing_and_holds_nothing_up(
    tmp_path: Path
) -> None:
    path = repo(tmp_path / "repo")
    plain, plain_s = verify(path)
    assert plain.returncode == 0, plain.stderr
    down, down_s = verify(path, "--otel", env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"})
    with Receiver(hang=True) as hanging:
        hung, hung_s = verify(path, "--otel",
                              env={"OTEL_EXPORTER_OTLP_ENDPOINT": hanging.endpoint})
    assert hanging.hits >= 1  # the export was sent, and never answered
    for proc in (down, hung):
        assert proc.returncode == plain.returncode, proc.stderr
        out = json.loads(proc.stdout)
        assert out["status"] == "PASS" and out["verdict"] == "PASS"
    # the export waits at most its timeout (3 s) plus a second, then gives up (measured:
    # 1.0 s more when refused, 4.7 s more when it hangs); the slack is for a loaded machine
    assert down_s < plain_s + 8, (plain_s, down_s)
    assert hung_s < plain_s + 8, (plain_s, hung_s)


@pytest.mark.parametrize("how", [("--otel",), ()])
def test_a_missing_extra_is_a_clear_usage_error(tmp_path: Path, how: tuple[str, ...]) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    # the SDK made unimportable, as on an install without the extra
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['opentelemetry.sdk'] = None\n")
    env = {"PYTHONPATH": str(shim), **({} if how else {"CHOIR_OTEL": "1"})}
    proc, _ = verify(repo(tmp_path / "repo"), *how, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'choir[otel]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_verify_with_otel_off_imports_nothing_from_opentelemetry(tmp_path: Path) -> None:
    """(``import choir`` and ``choir --help``: tests/unit/core/test_public_api.py.)"""
    proc, _ = verify(repo(tmp_path / "repo"), python=("-X", "importtime"),
                     env={"CHOIR_OTEL": ""})
    assert proc.returncode == 0, proc.stderr
    assert "import time:" in proc.stderr
    assert "opentelemetry" not in proc.stderr, "a verify with OTel off imported opentelemetry"


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("Linux only")
