"""The public surface: small, sorted, and light to import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import choir
import choir.exceptions


def test_all_is_sorted_and_resolvable() -> None:
    assert choir.__all__ == sorted(choir.__all__)
    for name in choir.__all__:
        assert getattr(choir, name) is not None, name


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        # the modules are listed before json is imported to print them
        [sys.executable, "-c",
         f"{code}\nimport sys\n_loaded = sorted(sys.modules)\n"
         "import json; print(json.dumps(_loaded))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


HEAVY = ("litellm", "langgraph", "docker", "openai", "aiohttp", "opentelemetry")


def test_import_choir_is_light() -> None:
    loaded = _modules_after("import choir")
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}


def test_cli_help_is_light() -> None:
    code = (
        "import sys\nfrom choir.cli import cli\n"
        "try:\n    cli.main(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass"
    )
    loaded = _modules_after(code)
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}
    assert "pydantic" not in loaded  # --help needs nothing but click


def test_the_warm_client_path_is_the_standard_librarys_light_modules() -> None:
    """What ``choir verify`` imports before a running ``choir serve`` takes its command line
    (``choir.cli._warm``): no click, no pydantic, and none of the standard library's slow
    ones (``typing``, ``dataclasses`` and its ``inspect``, ``hashlib`` and OpenSSL: 35 ms of
    a warm command's 120; ``json`` with its ``re`` and ``enum``, ``socket`` with its
    ``selectors``, ``pathlib`` with its ``urllib`` and ``ipaddress``: 6 ms more), measured."""
    loaded = _modules_after("import choir.cli, choir._core.paths, choir.serve.client\n"
                            "choir.serve.stale.code()\nchoir.serve.client.context()\n"
                            "choir.serve.client.connect(choir._core.paths.home_dir())\n"
                            "choir.serve.client.Call.start(choir._core.paths.home_dir(), {})\n"
                            "choir._core.wirejson.loads(choir._core.wirejson.dumps("
                            "{'context': choir.serve.client.context()}))")
    assert not {m for m in loaded if m.split(".")[0] in (*HEAVY, "click", "pydantic")}
    assert not {"typing", "dataclasses", "inspect", "hashlib", "_hashlib", "json", "re", "enum",
                "socket", "selectors", "pathlib", "urllib", "ipaddress", "array"} & loaded


def test_cli_help_lists_every_contract_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "choir", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("verify", "run", "approve", "audit", "attest", "ahdb", "gate"):
        assert f"  {command} " in out


PUBLIC_PACKAGES = ("choir.agent", "choir.ahdb", "choir.attest", "choir.audit", "choir.models",
                   "choir.report", "choir.sandbox", "choir.telemetry", "choir.testing")


def _public_names(module: object) -> set[str]:
    """What a package really offers: its public non-module names, whatever ``__all__`` says."""
    import types

    return {name for name, value in vars(module).items()
            if not name.startswith("_") and not isinstance(value, types.ModuleType)
            and name not in ("annotations", "TYPE_CHECKING")}


def test_choir_all_is_the_contract() -> None:
    assert choir.__all__ == ["Agent", "AgentContext", "ExecutionContext", "Mood", "WorkItem",
                             "__version__"]
    assert choir.exceptions.VerificationRejected and choir.exceptions.FatalAgentError


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_all_of_each_public_package_is_its_real_public_names_sorted(package: str) -> None:
    import importlib

    module = importlib.import_module(package)
    assert module.__all__ == sorted(module.__all__)
    assert set(module.__all__) == _public_names(module)
