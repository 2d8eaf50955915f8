"""One registry shape: names checked when configuration loads; third parties plug in.

The plugin is a real distribution (``tests/fixtures/plugins``: a package and its
``.dist-info`` with entry points) found by ``importlib.metadata`` on sys.path, the way pip
installs one.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from choir._core import registry as _registry
from choir.config import load_repo_config
from choir.exceptions import ConfigError, UnknownNameError
from choir.models import Limits

PLUGINS = Path(__file__).resolve().parents[2] / "fixtures" / "plugins"


@pytest.fixture(autouse=True)
def _fresh_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing a test loads stays cached for the next test in this worker."""
    for reg in (_registry.SANDBOXES, _registry.PARSERS, _registry.EXECUTORS,
                _registry.REPORTERS):
        monkeypatch.setattr(reg, "_loaded", {})


def _repo(tmp_path: Path, *, backend: str, parser: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "choir.yaml").write_text(textwrap.dedent(f"""\
        verifiers:
          unit:
            kind: unit_tests
            steps:
              - name: check
                command: "true; false"
            parser: {parser}
        sandbox:
          backend: {backend}
        """))
    return repo


def test_unknown_plugin_names_fail_at_load_with_did_you_mean_and_install_hint(
        tmp_path: Path) -> None:
    repo = _repo(tmp_path, backend="bwarp", parser="demo")
    with pytest.raises(ConfigError) as err:
        load_repo_config(repo)
    text = str(err.value)
    assert "unknown sandbox 'bwarp'" in text and "did you mean 'bwrap'" in text
    assert "choir.sandboxes" in text and "choir.yaml:9" in text
    assert "unknown parser 'demo'" in text and "choir.parsers" in text


def test_unknown_executor_kind_fails_when_the_work_item_loads(tmp_path: Path) -> None:
    from choir.config import load_work_item

    (tmp_path / "repo").mkdir()
    item = tmp_path / "item.yaml"
    item.write_text("id: x\ngoal: g\nrepo: ./repo\nexecutor:\n  kind: comand\n  command: 'true'\n")
    with pytest.raises(ConfigError) as err:
        load_work_item(item)
    assert "unknown executor 'comand'" in str(err.value)
    assert "did you mean 'command'" in str(err.value) and "choir.executors" in str(err.value)


def test_an_installed_plugin_adds_a_sandbox_and_a_parser(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from choir.report.parsers import ParseInput, get_parser, parser_names
    from choir.sandbox import get_sandbox, sandbox_names

    assert "demo" not in sandbox_names()
    with pytest.raises(UnknownNameError):
        get_sandbox("demo")
    monkeypatch.syspath_prepend(str(PLUGINS))
    assert "demo" in sandbox_names() and "demo" in parser_names()
    config = load_repo_config(_repo(tmp_path, backend="demo", parser="demo"))
    assert config.sandbox.backend == "demo"

    box = get_sandbox("demo")
    assert type(box).__module__ == "choir_demo_plugin.box"
    seen = bytearray()
    out = tmp_path / "out"
    result = box.exec("echo from-plugin; exit 3", repo=tmp_path / "repo", out_dir=out, env={},
                      timeout_s=30, limits=Limits(), network=False, sink=seen.extend)
    assert result.exit_code == 3
    assert bytes(seen) == b"[demo sandbox]\nfrom-plugin\n"

    parsed = get_parser("demo")(ParseInput(artifacts={}, store=None,  # type: ignore[arg-type]
                                           exit_codes=[0, 3]))
    assert (parsed.counts.run, parsed.counts.failed) == (2, 1)


def test_an_installed_plugin_adds_a_reporter_that_words_real_reports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from choir.evidence.artifacts import ArtifactStore
    from choir.models import Target
    from choir.report import abuild_report
    from choir.sandbox import get_sandbox
    from choir.verification.pipeline import run_verifier

    repo = _repo(tmp_path, backend="local", parser="generic")
    (repo / "choir.yaml").write_text((repo / "choir.yaml").read_text() + "reporter: demo\n")
    with pytest.raises(ConfigError, match="unknown reporter 'demo'"):
        load_repo_config(repo)
    monkeypatch.syspath_prepend(str(PLUGINS))
    config = load_repo_config(repo)
    assert config.reporter_name() == "demo"
    spec, store, target = config.verifiers["unit"], ArtifactStore(), Target(tree_hash="0" * 64)
    result = run_verifier(spec, repo=repo, sandbox=get_sandbox("local"), store=store,
                          run_id="plugin-report", target=target)
    report = asyncio.run(abuild_report(result, spec=spec, store=store, target=target,
                                       reporter_name=config.reporter_name()))
    assert report.summary == "In plain words: unit fail." and report.reporter == "demo"


def test_a_plugin_cannot_replace_a_builtin_name(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = _registry.Registry("sandbox", {"bwrap": "choir.sandbox.bwrap:BwrapSandbox"})
    monkeypatch.setattr(reg, "_plugins", lambda: {"bwrap": "choir_demo_plugin.box:DemoSandbox"})
    assert reg.specs()["bwrap"] == "choir.sandbox.bwrap:BwrapSandbox"


def test_auto_names_no_backend_and_prefers_the_strongest_isolation() -> None:
    import inspect

    from choir.sandbox import base

    source = inspect.getsource(base.resolve_auto)
    assert not any(f'"{name}"' in source for name in ("docker", "bwrap", "local"))
    from choir.sandbox.bwrap import BwrapSandbox
    from choir.sandbox.docker import DockerSandbox
    from choir.sandbox.local import LocalSandbox

    assert DockerSandbox.auto_rank < BwrapSandbox.auto_rank < LocalSandbox.auto_rank  # type: ignore[operator]


def test_a_plugin_preset_is_found_under_the_documented_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the README names `choir.presets`; the layout's move had renamed the group to
    # `choir.config.presets`, so a plugin written from the README was never found
    from choir.config.presets import load_presets

    load_presets.cache_clear()
    monkeypatch.syspath_prepend(str(PLUGINS))
    try:
        repo = tmp_path / "repo"
        repo.mkdir()
        (repo / "choir.yaml").write_text("verifiers:\n  smoke: {uses: demo}\n")
        config = load_repo_config(repo)
        assert config.verifiers["smoke"].steps[0].command == "true"
    finally:
        load_presets.cache_clear()


# --- the plugins installed, scanned once while nothing they depend on changes ----------------

LONG_AGO = time.time_ns() - 3600 * 10**9


def _install(site: Path, name: str) -> None:
    """What pip leaves: a ``.dist-info`` folder with one sandbox entry point."""
    meta = site / f"{name}-0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    (meta / "entry_points.txt").write_text(
        f"[choir.sandboxes]\n{name} = choir.sandbox.local:LocalSandbox\n")


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each scan of the installed distributions, counted; no warm cache in this process."""
    import importlib.metadata

    from choir._core import warm

    monkeypatch.setattr(warm, "_enabled", False)
    monkeypatch.setattr(warm, "_memo", False)
    seen: list[int] = []
    real = importlib.metadata.entry_points

    def counted(**params: Any) -> Any:
        seen.append(1)
        return real(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted)
    return seen


def test_the_plugins_are_scanned_once_and_a_package_installed_later_is_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scans: list[int]) -> None:
    site = tmp_path / "site"
    site.mkdir()
    os.utime(site, ns=(LONG_AGO, LONG_AGO))
    monkeypatch.syspath_prepend(str(site))
    assert "late" not in _registry.SANDBOXES.names()
    for reg in (_registry.SANDBOXES, _registry.PARSERS, _registry.EXECUTORS):
        reg.names()
    assert len(scans) == 1  # one scan served every registry and every call
    _install(site, "late")
    assert "late" in _registry.SANDBOXES.names() and len(scans) == 2
    monkeypatch.syspath_prepend(str(PLUGINS))  # another path: scanned again
    assert "demo" in _registry.SANDBOXES.names() and len(scans) == 3


@pytest.mark.parametrize("racy_s", [_registry.RACY_S, 0.0])
def test_a_package_installed_within_the_timestamp_tick_of_a_scan_is_not_missed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scans: list[int],
        racy_s: float) -> None:
    """The folder's mtime is kept as it was after the install: the install fell in the same
    tick of the file system's clock as the scan before it. A scan that near a change to a
    folder it read is not kept; with no such margin (``racy_s=0``) the stale answer stays."""
    monkeypatch.setattr(_registry, "RACY_S", racy_s)
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    mtime = time.time_ns()  # the folder changed just before the scan
    os.utime(site, ns=(mtime, mtime))
    assert "racy" not in _registry.SANDBOXES.names()
    _install(site, "racy")
    os.utime(site, ns=(mtime, mtime))
    # importlib.metadata keeps its own listing of the folder by its mtime, and so does its
    # backport, which a package importing it puts on sys.meta_path: both cleared, so what
    # is shown is Choir's cache alone
    for name in ("importlib.metadata", "importlib_metadata"):
        if name in sys.modules:
            sys.modules[name].FastPath.__new__.cache_clear()
    assert ("racy" in _registry.SANDBOXES.names()) is (racy_s > 0)
