"""Review 23b: a folder that HOLDS a shared temp root is refused like the root itself.

A Unix socket connects through a read-only bind, and /tmp, /var/tmp and Choir's temp folder
hold the host's sockets (tmux, X11, agents, other steps' egress proxies). Only the roots
themselves were refused: ``sandbox.binds: [/var]`` passed ``check_bind``, and an executor
of a repo in /var (``/var/www``) got /var bound around it; either way a network-off step
talked to a host service under /var/tmp, and its attestation said nothing of the bind.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from choir._core.canonical import blake3_hex, canonical_json
from choir.attest.mint import signed_bytes
from choir.exceptions import ConfigError
from choir.executors import _around
from choir.models import AttestationBody, Environment, Platform, RunManifest, Target
from choir.models.report import Result
from choir.sandbox import _toolchain
from choir.sandbox._toolchain import check_bind


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``box/scratch`` stands for a shared temp root; ``box`` is the folder holding it."""
    (tmp_path / "box" / "scratch").mkdir(parents=True)
    (tmp_path / "box" / "data").mkdir()
    monkeypatch.setattr(_toolchain, "SHARED_ROOTS", (str(tmp_path / "box" / "scratch"),))
    return tmp_path / "box"


def test_a_bind_holding_a_shared_temp_root_is_refused(box: Path) -> None:
    with pytest.raises(ConfigError, match="shared") as caught:
        check_bind(str(box), origin="sandbox.binds")
    assert str(box / "scratch") in str(caught.value)  # names what it holds
    assert check_bind(str(box / "data"), origin="t") == os.path.realpath(box / "data")


def test_a_link_to_a_folder_holding_a_shared_root_is_refused(box: Path, tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(box)
    with pytest.raises(ConfigError, match="shared"):
        check_bind(str(tmp_path / "link"), origin="sandbox.binds")


def test_a_bind_holding_choirs_temp_folder_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Egress sockets fall back to ``tempfile.gettempdir()``: a folder holding it is refused."""
    (tmp_path / "outer" / "tmp").mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "outer" / "tmp"))
    with pytest.raises(ConfigError, match="shared"):
        check_bind(str(tmp_path / "outer"), origin="sandbox.binds")


@pytest.mark.skipif(not os.path.isdir("/var/tmp"), reason="no /var/tmp here")
def test_binding_the_real_var_is_refused() -> None:
    with pytest.raises(ConfigError, match="/var/tmp"):
        check_bind("/var", origin="sandbox.binds")


def test_an_executor_repo_beside_a_shared_root_does_not_get_its_parent_bound(box: Path) -> None:
    assert _around(box / "repo") == []
    assert _around(box / "data" / "repo") == [box / "data"]  # holds none: still readable


@pytest.mark.skipif(not os.path.isdir("/var/tmp"), reason="no /var/tmp here")
def test_an_executor_repo_in_var_does_not_get_var_bound() -> None:
    assert _around(Path("/var/www")) == []


# -- the binds recorded in the manifest and the attestation ------------------------------

# the ids of a body and a manifest without binds, computed before ``binds`` existed: they must
# not change, or every stored attestation and manifest would fail its check
BODY_ID = "c8fa996e678f412efb59d4af2293cc3a5d25c40f4bcb7133c1829882b7b98736"
MANIFEST_ID = "b698b24baa2ccbb407fb700afad3ef034cfff08759b5f2dd46d06ec71373d368"


def _platform(**extra: object) -> Platform:
    return Platform(os="linux", arch="x86_64", sandbox="bwrap", isolation="namespace",
                    **extra)  # type: ignore[arg-type]


def _body(**extra: object) -> AttestationBody:
    when = datetime(2026, 11, 28, tzinfo=UTC)
    return AttestationBody(
        run_id="r", verifier="unit", verifier_kind="unit_tests", verifier_version="choir/0",
        verifier_config_hash="c" * 64, commands=("true",),
        target=Target(tree_hash="t" * 64), result=Result.PASS, report_hash="a" * 64,
        manifest_hash="b" * 64, started_at=when, ended_at=when,
        environment=Environment(sandbox="bwrap", isolation="namespace", **extra))  # type: ignore[arg-type]


def _manifest(platform: Platform) -> RunManifest:
    when = datetime(2026, 11, 28, tzinfo=UTC)
    return RunManifest(run_id="r", verifier="unit", status="PASS", timestamp_start=when,
                       timestamp_end=when, tree_hash="t" * 64, platform=platform)


def test_a_body_and_manifest_without_binds_hash_as_before() -> None:
    assert blake3_hex(signed_bytes(_body())) == BODY_ID
    assert blake3_hex(canonical_json(_manifest(_platform()))) == MANIFEST_ID
    assert b"binds" not in signed_bytes(_body())


def test_binds_are_recorded_when_there_are_some() -> None:
    body = _body(binds=("/srv/data",))
    assert body.environment.binds == ("/srv/data",)
    assert b'"binds":["/srv/data"]' in signed_bytes(body)
    assert b'"binds":["/srv/data"]' in canonical_json(_manifest(_platform(binds=("/srv/data",))))
