"""Mood policies: plans are subsets of the allowlist, and CALM ⊆ SKEPTICAL ⊆ PARANOID."""

from __future__ import annotations

from pathlib import Path

import pytest

from choir.config import load_repo_config
from choir.config.policy import load_packaged_policy, load_policy
from choir.models import BlastRadius, Mood

ALL_KINDS = """\
verifiers:
  unit: {kind: unit_tests, steps: [{name: t, command: "true"}]}
  integ: {kind: integration_tests, steps: [{name: t, command: "true"}]}
  lint: {kind: lint, steps: [{name: t, command: "true"}]}
  types: {kind: typecheck, steps: [{name: t, command: "true"}]}
  sec: {kind: security_scan, steps: [{name: t, command: "true"}]}
  sast: {kind: static_analysis, steps: [{name: t, command: "true"}]}
"""


def config(tmp_path: Path, text: str = ALL_KINDS):  # type: ignore[no-untyped-def]
    (tmp_path / "choir.yaml").write_text(text)
    return load_repo_config(tmp_path)


def test_packaged_moods_nest() -> None:
    packaged = load_packaged_policy()
    calm = set(packaged.moods[Mood.CALM].kinds)
    skeptical = set(packaged.moods[Mood.SKEPTICAL].kinds)
    paranoid = set(packaged.moods[Mood.PARANOID].kinds)
    assert calm <= skeptical <= paranoid
    assert packaged.moods[Mood.PARANOID].reruns >= 2
    assert packaged.moods[Mood.PARANOID].allow_unsafe_isolation is False
    assert set(packaged.moods) == set(Mood)


def test_resolved_moods_nest_and_stay_in_allowlist(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    policy = load_policy(cfg)
    calm = set(policy.moods[Mood.CALM].verifiers)
    skeptical = set(policy.moods[Mood.SKEPTICAL].verifiers)
    paranoid = set(policy.moods[Mood.PARANOID].verifiers)
    assert calm == {"unit"}
    assert calm <= skeptical <= paranoid <= set(cfg.verifiers)
    assert {"sec", "sast"} <= paranoid and not {"sec", "sast"} & skeptical
    bold = policy.moods[Mood.BOLD]
    assert set(bold.verifiers) == {"unit"} and set(bold.broaden) == {"integ", "lint", "types",
                                                                     "sec", "sast"}
    for mood in policy.moods.values():
        assert set(mood.verifiers) | set(mood.broaden) <= set(cfg.verifiers)


def test_override_by_name_wins(tmp_path: Path) -> None:
    cfg = config(tmp_path, ALL_KINDS + "moods:\n  CALM: {verifiers: [lint]}\n")
    assert load_policy(cfg).moods[Mood.CALM].verifiers == ("lint",)


def test_mood_matching_no_kind_falls_back_to_whole_allowlist(tmp_path: Path) -> None:
    cfg = config(tmp_path, "verifiers:\n  l: {kind: lint, steps: [{name: t, command: x}]}\n")
    assert load_policy(cfg).moods[Mood.CALM].verifiers == ("l",)


def test_policy_hash_changes_with_content(tmp_path: Path) -> None:
    a = load_policy(config(tmp_path))
    b = load_policy(config(tmp_path, ALL_KINDS + "moods:\n  CALM: {verifiers: [lint]}\n"))
    assert a.hash != b.hash and len(a.hash) == 64
    assert a.hash == load_policy(config(tmp_path, ALL_KINDS)).hash


@pytest.mark.parametrize("radius", list(BlastRadius))
def test_approval_only_for_large_by_default(tmp_path: Path, radius: BlastRadius) -> None:
    policy = load_policy(config(tmp_path))
    assert policy.needs_approval(radius) is (radius is BlastRadius.LARGE)
