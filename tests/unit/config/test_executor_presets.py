"""``uses: claude-code`` (codex, aider, opencode) under ``executor:``: what a preset fills in,
what the work item may replace, and the mistakes caught before anything runs (exit 2)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from choir.config import load_work_item
from choir.config.agents import executor_presets
from choir.exceptions import ConfigError
from choir.models import WorkItem
from tests.agent_clis import install_standins


@pytest.fixture
def standins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in CLIs on PATH, in a folder the executor's sandbox sees (the repo's parent)."""
    folder = install_standins(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    for var in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(var, raising=False)
    return folder


def _item(tmp_path: Path, executor: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "choir.yaml").write_text("verification:\n  steps: [{name: t, command: 'true'}]\n")
    path = tmp_path / "item.yaml"
    path.write_text("id: agent-item\ngoal: make it so\nrepo: ./repo\nexecutor:\n"
                    + textwrap.indent(textwrap.dedent(executor), "  "))
    return path


def _errors(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_work_item(path)
    return str(caught.value)


def test_the_four_presets_are_agents_with_a_host_list() -> None:
    presets = executor_presets()
    assert sorted(presets) == ["aider", "claude-code", "codex", "opencode"]
    for name, preset in presets.items():
        assert preset["kind"] == "agent" and preset["hosts"], name
        assert "$CHOIR_PROMPT_FILE" in preset["command"], name
        assert not any(var.startswith("CHOIR_") for var in preset.get("pass_env", ())), name
    assert presets["claude-code"]["command"].startswith("claude -p ")
    assert "--output-format json" in presets["claude-code"]["command"]
    assert presets["codex"]["command"].startswith("codex exec ")
    assert "--yes-always" in presets["aider"]["command"]
    assert presets["opencode"]["command"].startswith("opencode run ")


@pytest.mark.parametrize("name", ["claude-code", "codex", "aider", "opencode"])
def test_a_preset_expands_to_a_full_executor(tmp_path: Path, standins: Path,
                                             name: str) -> None:
    item = load_work_item(_item(tmp_path, f"uses: {name}\n"))
    preset = executor_presets()[name]
    executor = item.executor
    assert executor.kind == "agent" and executor.command == preset["command"]
    assert executor.hosts == tuple(sorted(f"{h}:443" for h in preset["hosts"]))
    assert executor.pass_env == tuple(preset["pass_env"])
    assert "uses" not in executor.model_dump()  # validated, it never mentions presets
    WorkItem.model_validate_json(item.model_dump_json())  # saved and read back as is


def test_a_field_beside_uses_replaces_the_presets_whole(tmp_path: Path, standins: Path) -> None:
    executor = load_work_item(_item(tmp_path, """\
        uses: aider
        hosts: ['127.0.0.1:8080']
        env: {AIDER_MODEL: gpt-4o-mini}
        timeout_s: 60
        """)).executor
    assert executor.hosts == ("127.0.0.1:8080",)
    assert executor.env == {"AIDER_MODEL": "gpt-4o-mini"} and executor.timeout_s == 60


def test_an_unknown_preset_names_the_known_ones(tmp_path: Path, standins: Path) -> None:
    message = _errors(_item(tmp_path, "uses: claude\n"))
    assert "item.yaml:5" in message and "unknown preset 'claude'" in message
    assert "claude-code" in message and "codex" in message


def test_a_program_not_on_path_says_how_to_install_it(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    message = _errors(_item(tmp_path, "uses: codex\n"))
    assert "'codex' is not on PATH" in message and "npm install -g @openai/codex" in message


def test_a_program_the_sandbox_cannot_see_asks_for_a_bind(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = install_standins(tmp_path.parent / f"{tmp_path.name}-tools" / "bin")
    monkeypatch.setenv("PATH", f"{elsewhere}:{os.environ['PATH']}")
    message = _errors(_item(tmp_path, "uses: claude-code\n"))
    assert "does not see" in message and f"binds: [{elsewhere}]" in message
    load_work_item(_item(tmp_path, f"uses: claude-code\nbinds: ['{elsewhere}']\n"))


def test_a_bind_may_not_expose_choirs_home(tmp_path: Path, standins: Path,
                                           choir_home: Path) -> None:
    message = _errors(_item(tmp_path, f"uses: claude-code\nbinds: ['{choir_home}']\n"))
    assert "CHOIR_HOME" in message


def test_a_model_api_moved_by_the_environment_must_be_listed(
        tmp_path: Path, standins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://gateway.corp.example:8443/anthropic")
    message = _errors(_item(tmp_path, "uses: claude-code\n"))
    assert "gateway.corp.example:8443" in message and "hosts:" in message
    item = load_work_item(_item(tmp_path, "uses: claude-code\n"
                                "hosts: ['gateway.corp.example:8443']\n"))
    assert item.executor.hosts == ("gateway.corp.example:8443",)


@pytest.mark.parametrize(("field", "value", "wanted"), [
    ("hosts", "['http://api.openai.com']", "not 'host[:port]'"),
    ("hosts", "['127.1']", "neither a host name"),
    ("pass_env", "[CHOIR_HOME]", "Choir's own setting"),
    ("pass_env", "['A B']", "not an environment variable name"),
])
def test_bad_fields_are_named_with_their_line(tmp_path: Path, standins: Path, field: str,
                                              value: str, wanted: str) -> None:
    message = _errors(_item(tmp_path, f"uses: claude-code\n{field}: {value}\n"))
    assert wanted in message and "item.yaml:6" in message


def test_an_agent_without_a_preset_needs_a_command(tmp_path: Path) -> None:
    assert "needs 'command'" in _errors(_item(tmp_path, "kind: agent\n"))


def test_a_team_plans_members_and_items_use_presets_too(tmp_path: Path) -> None:
    from choir.team.plan import load_plan
    from tests.team import team_repo

    team_repo(tmp_path / "repo")
    plan_file = tmp_path / "plan.yaml"
    body = textwrap.dedent("""\
        id: p
        repo: ./repo
        base: main
        members:
          claude: {executor: {uses: claude-code, hosts: ['127.0.0.1:8080']}}
          BAD
        items:
          - {id: a, goal: a, member: claude}
          - {id: b, goal: b, executor: {uses: codex}, escalate_to: {uses: aider}}
        """)
    plan_file.write_text(body.replace("BAD", ""))
    plan = load_plan(plan_file)
    assert plan.members["claude"].executor.kind == "agent"
    assert plan.members["claude"].executor.hosts == ("127.0.0.1:8080",)
    item = plan.work_item("b", tmp_path)
    assert item.executor.command is not None and item.executor.command.startswith("codex exec")
    assert isinstance(item.escalate_to, type(item.executor))
    assert item.escalate_to.command is not None and item.escalate_to.command.startswith("aider")
    plan_file.write_text(body.replace("BAD", "bad: {executor: {uses: nope}}"))
    with pytest.raises(ConfigError) as caught:
        load_plan(plan_file)
    assert "unknown preset 'nope'" in str(caught.value) and "plan.yaml:6" in str(caught.value)
