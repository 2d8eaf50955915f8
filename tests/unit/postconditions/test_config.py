"""Postconditions and decisions in choir.yaml: checked at load, every mistake with its line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from choir.config import load_repo_config, load_work_item
from choir.exceptions import ConfigError
from choir.models import VerifierKind
from choir.postconditions.decisions import Decision, required_methods


def _write(repo: Path, config: str, files: dict[str, str] | None = None) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "choir.yaml").write_text(textwrap.dedent(config))
    for rel, text in (files or {}).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    return repo


GOOD = """\
resources:
  db: {sqlite: state/app.db}
  api: {http: "http://127.0.0.1:8080"}
verifiers:
  unit:
    kind: unit_tests
    steps: [{name: t, command: "true"}]
  flag_set:
    read_after_write:
      resource: db
      sql: SELECT value FROM flags WHERE name = :name
      expect_from: value
  healthy:
    invariant_check: {resource: api, path: /health, status: 200}
decisions:
  set_flag:
    verification:
      required_above_blast_radius: small
      methods: [flag_set, healthy, audit_trail]
      verify_timeout_ms: 3000
"""


def test_postconditions_become_allowlisted_verifiers(tmp_path: Path) -> None:
    repo = _write(tmp_path / "repo", GOOD, {"state/app.db": "",
                                           "verifiers/audit_trail.py": "def verify(c): ..."})
    config = load_repo_config(repo)
    flag = config.verifiers["flag_set"]
    assert flag.kind is VerifierKind.POSTCONDITION and flag.parser == "postcondition"
    payload = json.loads(flag.env["CHOIR_PC_SPEC"])
    assert payload["resource"] == {"kind": "sqlite", "path": str(repo / "state" / "app.db")}
    assert flag.network is False  # a file needs no network
    healthy = config.verifiers["healthy"]
    assert healthy.network is True and healthy.hosts == ("127.0.0.1:8080",)
    # a decision method found as verifiers/NAME.py joins the allowlist as a callable
    assert json.loads(config.verifiers["audit_trail"].env["CHOIR_PC_SPEC"])["callable"] == \
        "verifiers/audit_trail.py"
    assert str(repo / "state") in config.sandbox.binds
    assert config.decisions["set_flag"].verification.verify_timeout_ms == 3000


@pytest.mark.parametrize(("threshold", "radius", "required"), [
    ("small", "small", False), ("small", "medium", True), ("small", "large", True),
    ("medium", "medium", False), ("none", "small", True), ("large", "large", False)])
def test_threshold_makes_methods_required_above_it(threshold: str, radius: str,
                                                   required: bool) -> None:
    decision = Decision.model_validate(
        {"verification": {"required_above_blast_radius": threshold, "methods": ["m"]}})
    assert required_methods(decision, radius) == (("m",) if required else ())


def test_work_item_decision_type_adds_required_methods(tmp_path: Path) -> None:
    _write(tmp_path / "repo", GOOD, {"state/app.db": "", "verifiers/audit_trail.py": ""})
    item_file = tmp_path / "item.yaml"
    for radius, expected in (("small", ()), ("large", ("flag_set", "healthy", "audit_trail"))):
        item_file.write_text(f"id: flip\ngoal: flip it\nrepo: ./repo\ndecision_type: set_flag\n"
                             f"blast_radius: {radius}\naction: {{name: beta, value: 'on'}}\n"
                             "executor: {kind: command, command: 'true'}\n")
        item = load_work_item(item_file)
        assert item.required_verifiers == expected
        assert item.action == {"name": "beta", "value": "on"}


def test_unknown_decision_type_names_file_line_and_fix(tmp_path: Path) -> None:
    _write(tmp_path / "repo", GOOD, {"state/app.db": "", "verifiers/audit_trail.py": ""})
    item_file = tmp_path / "item.yaml"
    item_file.write_text("id: flip\ngoal: g\nrepo: ./repo\ndecision_type: set_flg\n"
                         "executor: {kind: command, command: 'true'}\n")
    with pytest.raises(ConfigError) as err:
        load_work_item(item_file)
    text = str(err.value)
    assert f"{item_file}:4:" in text and "did you mean 'set_flag'" in text


def test_every_mistake_reported_at_once_with_lines(tmp_path: Path) -> None:
    repo = _write(tmp_path / "repo", """\
        resources:
          db: {sqlite: app.db, http: "http://x"}
          api: {http: "http://127.0.0.1:1"}
        verifiers:
          a:
            read_after_write: {resource: nowhere, sql: "SELECT 1", expect: 1}
          b:
            callable: verifiers/missing.py
          c:
            callable: mod:fn
            network: true
          d:
            invariant_check: {resource: api, sql: "SELECT 1"}
          e:
            callable: mod:fn
            invariant_check: {resource: api, path: /h, status: 200}
        decisions:
          deploy:
            verification:
              methods: [a, typo_method]
              required_above_blast_radius: huge
        """)
    with pytest.raises(ConfigError) as err:
        load_repo_config(repo)
    text = str(err.value)
    source = repo / "choir.yaml"
    for line, words in [(2, "exactly one of"), (6, "unknown resource 'nowhere'"),
                        (8, "verifiers/missing.py does not exist"),
                        (11, "names no host"), (13, "needs 'path:'"),
                        (14, "several postcondition methods"),
                        (20, "unknown verification method 'typo_method'"),
                        (21, "required_above_blast_radius")]:
        assert any(f"{source}:{line}:" in part and words in part
                   for part in text.split("\n")), (line, words, text)


def test_decision_timeout_is_the_budget_of_methods_without_their_own(tmp_path: Path) -> None:
    repo = _write(tmp_path / "repo", GOOD, {"state/app.db": "",
                                           "verifiers/audit_trail.py": "def verify(c): ..."})
    config = load_repo_config(repo)
    flag = json.loads(config.verifiers["flag_set"].env["CHOIR_PC_SPEC"])
    custom = json.loads(config.verifiers["audit_trail"].env["CHOIR_PC_SPEC"])
    assert flag["verify_timeout_ms"] == 3000 and flag["timeout_s"] == 5.0
    assert custom["timeout_s"] == 5.0  # a callable gets the decision's budget too


def test_decisions_survive_a_checkpoint_round_trip(tmp_path: Path) -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from choir.graph.state import checkpoint_types

    repo = _write(tmp_path / "repo", GOOD, {"state/app.db": "",
                                           "verifiers/audit_trail.py": "def verify(c): ..."})
    config = load_repo_config(repo)
    serde = JsonPlusSerializer(allowed_msgpack_modules=checkpoint_types())
    back = serde.loads_typed(serde.dumps_typed(config))
    assert back == config and type(back.decisions["set_flag"]) is Decision


def test_a_postgres_resource_is_reached_through_its_egress_tunnel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No DNS and no HTTP proxy for libpq: the harness connects to the forwarder's loopback
    port with ``hostaddr``, keeping the DSN's host for TLS and authentication."""
    from choir.postconditions._harness import egress_tunnel

    dsn = "postgresql://app@DB.internal/app?sslmode=verify-full"
    assert egress_tunnel(dsn) == {}
    monkeypatch.setenv("CHOIR_EGRESS_TUNNELS", '{"db.internal:5432": "127.0.0.1:40123"}')
    assert egress_tunnel(dsn) == {"hostaddr": "127.0.0.1", "port": 40123}
    assert egress_tunnel("postgresql://app@db.internal:6543/app") == {}
    assert egress_tunnel("host=db.internal dbname=app") == {}
