"""The public surface: small, sorted, and light to import."""

from __future__ import annotations

import json
import subprocess
import sys

import choir


def test_all_is_sorted_and_resolvable() -> None:
    assert choir.__all__ == sorted(choir.__all__)
    for name in choir.__all__:
        assert getattr(choir, name) is not None, name


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


HEAVY = ("litellm", "langgraph", "docker", "openai", "aiohttp")


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


def test_cli_help_lists_every_contract_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "choir", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("verify", "run", "approve", "audit", "attest", "ahdb", "gate"):
        assert f"  {command} " in out
