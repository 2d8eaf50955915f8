"""Mood policies: which allowlisted verifiers each mood runs, and the loop's bounds.

The packaged defaults (``policies/moods.yaml``) choose verifiers by kind, so they fit any repo;
``choir.yaml`` overrides a mood by verifier name. A policy never names a verifier outside the
allowlist: such a name is a configuration error (exit 2), never a silent skip.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from choir._core import warm
from choir._core.canonical import hash_json
from choir._core.resources import data_path
from choir.config import RepoConfig
from choir.config._yaml import YamlDoc, load_yaml, validate
from choir.exceptions import ConfigError
from choir.models import BlastRadius, Mood, StepSpec, VerifierKind, VerifierSpec
from choir.models._base import Frozen

POLICY_FILE = "moods.yaml"
SpecPolicy = Literal["refuse", "approve"]
Survivors = Literal["fail", "inconclusive"]
Rehash = Literal["stat", "full"]
MUTANTS_SUFFIX = ".mutants"
# the name of Choir's trace verifier when the repo has a verifier named ``trace`` of another
# kind; like ``NAME.mutants``, reserved: choir.yaml may not use it (``choir.config._reserved``)
RUN_TRACE_NAME = "choir-trace"


class _PackagedMood(Frozen):
    kinds: tuple[VerifierKind, ...]
    broaden_kinds: tuple[VerifierKind, ...] = ()
    reruns: int = Field(default=1, ge=1, le=5)
    allow_unsafe_isolation: bool = True
    require_limits: bool = False
    # the run's own trace, verified and attested, before anything is ASSERTed (choir run)
    require_trace: bool = False
    spec_change: SpecPolicy = "refuse"
    require_heldout: bool = False
    mutation_survivors: Survivors = "fail"
    mutants: int = Field(default=8, ge=1, le=64)
    rehash: Rehash = "stat"


class _PackagedPolicy(Frozen):
    moods: dict[Mood, _PackagedMood]
    approval_at: tuple[BlastRadius, ...] = (BlastRadius.LARGE,)
    same_signature_limit: int = Field(default=2, ge=1)
    halt_after: int = Field(default=3, ge=1)
    nested_max: int = Field(default=2, ge=0, le=5)
    max_parallel: int = Field(default=6, ge=1, le=64)
    max_mood_switches: int = Field(default=2, ge=0, le=4)
    split_depth: int = Field(default=2, ge=0, le=4)
    escalate_to: str | None = Field(default=None, pattern=r"^human$")


class MoodPolicy(Frozen):
    """One mood resolved against a repo's allowlist: verifier names only."""

    verifiers: tuple[str, ...]
    broaden: tuple[str, ...] = ()
    reruns: int = 1
    allow_unsafe_isolation: bool = True
    # refuse a sandbox that cannot enforce memory/pids/out limits (Sandbox.limits_enforceable)
    require_limits: bool = False
    # a change to a pinned spec file that the work item's may_change_spec names: refused, or
    # held for a person with the diff attached (approve); outside it, always refused
    spec_change: SpecPolicy = "refuse"
    # every held-out check of the repo (choir.config.heldout) runs in this mood, whatever
    # its kind or the repo's mood override
    require_heldout: bool = False
    # a mutant of the executor's changed lines that the pinned tests do not kill makes the
    # mutation check FAIL (the executor is told which line) or INCONCLUSIVE (never ASSERTed,
    # looked at again); ``mutants``: at most this many per round
    mutation_survivors: Survivors = "fail"
    mutants: int = 8
    # how a round's tree is hashed: files whose lstat is unchanged taken from the trusted
    # stat cache (stat), or every file read again and the sealed snapshot hashed whole
    # (full); a repo's choir.yaml cannot change it (docs/security.md, "Incremental
    # snapshots")
    rehash: Rehash = "stat"


class Policy(Frozen):
    """The policy in force for a repo. Its hash is signed into every attestation."""

    moods: dict[Mood, MoodPolicy]
    approval_at: tuple[BlastRadius, ...] = (BlastRadius.LARGE,)
    same_signature_limit: int = 2
    halt_after: int = 3
    nested_max: int = 2
    max_parallel: int = 6
    # bounds of the governance loop (docs/concepts.md): mood switches per run, nested splits
    max_mood_switches: int = 2
    split_depth: int = 2
    # who gets a work item the loop cannot satisfy when the work item names nobody: a person
    # (through the approval interrupt) or, unset, nobody (the run halts)
    escalate_to: str | None = None

    @cached_property
    def hash(self) -> str:
        return hash_json(self.model_dump(mode="json"))

    def needs_approval(self, blast_radius: BlastRadius) -> bool:
        return blast_radius in self.approval_at


def _packaged_doc() -> YamlDoc:
    path = Path(str(data_path("policies") / POLICY_FILE))
    return load_yaml(path)


@warm.cached
def load_packaged_policy() -> _PackagedPolicy:
    """The packaged defaults. A broken packaged file is a ConfigError like any other."""
    doc = _packaged_doc()
    result: _PackagedPolicy = validate(doc, _PackagedPolicy)
    return result


def full_rehash(mood: Mood) -> bool:
    """Whether ``mood`` hashes every file again (``rehash: full``), from the packaged
    policy alone (a repo cannot weaken it), so ``choir verify`` can start its snapshot
    before it reads the repo's configuration."""
    policy = load_packaged_policy()
    found = policy.moods.get(mood) or policy.moods[Mood.SKEPTICAL]
    return found.rehash == "full"


def with_run_checks(config: RepoConfig,
                    packaged: _PackagedPolicy | None = None) -> RepoConfig:
    """The allowlist of a ``choir run``: when a mood requires a verified trace
    (``require_trace``, PARANOID) and the repo declares no ``trace`` verifier, Choir's own is
    added, so a run in that mood is never ASSERTed on an unverified trace. It runs Choir's
    trace verifier in-process on the run's own record, no code of the repo's.
    """
    base = packaged or load_packaged_policy()
    config = with_mutation(config, base)
    if not any(m.require_trace for m in base.moods.values()):
        return config
    if any(spec.kind is VerifierKind.TRACE for spec in config.verifiers.values()):
        return config
    name = "trace" if "trace" not in config.verifiers else RUN_TRACE_NAME
    spec = VerifierSpec(name=name, kind=VerifierKind.TRACE,
                        steps=(StepSpec(name="verify", command="choir trace verify"),))
    return _adding(config, spec)


def with_mutation(config: RepoConfig, base: _PackagedPolicy) -> RepoConfig:
    """When a mood plans mutation checks (BOLD, PARANOID), the allowlist of a ``choir run``
    gains one: ``NAME.mutants`` runs the steps of the repo's first unit-test verifier (else
    its pipeline) on mutants of the lines the executor changed (``choir.director.mutation``).
    """
    if not any(VerifierKind.MUTATION in m.kinds for m in base.moods.values()) or any(
            s.kind is VerifierKind.MUTATION for s in config.verifiers.values()):
        return config
    source = next((s for kind in (VerifierKind.UNIT_TESTS, VerifierKind.PIPELINE)
                   for s in config.verifiers.values()
                   if s.kind is kind and s.heldout is None), None)
    if source is None:
        return config
    name = f"{source.name[:64 - len(MUTANTS_SUFFIX)]}{MUTANTS_SUFFIX}"
    spec = source.model_copy(update={"name": name, "kind": VerifierKind.MUTATION,
                                     "mutates": source.name})
    return _adding(config, spec)


def _adding(config: RepoConfig, spec: VerifierSpec) -> RepoConfig:
    """``config`` with Choir's run check ``spec`` added to its allowlist, never in place of
    a verifier of the same name: that one would silently not run, and a run could ASSERT
    while it fails (review 20, F4). choir.yaml cannot use these names; a held-out check or
    a configuration built in code still could.

    Raises:
        ConfigError: the allowlist already has a verifier of that name.
    """
    if spec.name in config.verifiers:
        raise ConfigError(f"verifier name '{spec.name}' is taken: choir run adds its own "
                          f"{spec.kind.value} check under that name", path=config.source,
                          line=config.lines.get(spec.name),
                          hint=f"rename the verifier '{spec.name}'")
    return config.model_copy(update={"verifiers": {**config.verifiers, spec.name: spec}})


def guarded(mood: Any) -> bool:
    """A mood whose checks a repo may add to but never narrow: one that refuses unsafe
    isolation (PARANOID). The others' lists are the repo's to choose (``moods: {CALM:
    {verifiers: [unit]}}``)."""
    return not mood.allow_unsafe_isolation


def _by_kind(config: RepoConfig, kinds: tuple[VerifierKind, ...]) -> tuple[str, ...]:
    wanted = set(kinds)
    return tuple(name for name, spec in config.verifiers.items() if spec.kind in wanted)


def load_policy(config: RepoConfig, packaged: _PackagedPolicy | None = None) -> Policy:
    """Resolve the packaged moods against ``config``'s allowlist, then apply its overrides.

    A mood whose kinds match nothing in the allowlist but the run's own trace falls back to
    the whole allowlist:
    running every allowlisted verifier is stricter than running none, and "no verifier, no
    assert" means an empty plan could never finish.
    """
    base = packaged or load_packaged_policy()
    moods: dict[Mood, MoodPolicy] = {}
    for mood in Mood:
        default = base.moods.get(mood) or base.moods[Mood.SKEPTICAL]
        checks = tuple(n for n, spec in config.verifiers.items()
                       if spec.kind not in (VerifierKind.TRACE, VerifierKind.MUTATION))
        core = _by_kind(config, default.kinds)
        if not any(n in checks for n in core):  # the run's own trace checks no code
            core = (*checks, *core)
        broaden = tuple(n for n in _by_kind(config, default.broaden_kinds) if n not in core)
        fields: dict[str, Any] = {
            "verifiers": core,
            "broaden": broaden,
            "reruns": default.reruns,
            "allow_unsafe_isolation": default.allow_unsafe_isolation,
            "require_limits": default.require_limits,
            "spec_change": default.spec_change,
            "require_heldout": default.require_heldout,
            "mutation_survivors": default.mutation_survivors,
            "mutants": default.mutants,
            "rehash": default.rehash,
        }
        override = config.moods.get(mood)
        if override is not None:
            fields.update(
                {k: v for k, v in override.model_dump().items() if v is not None}
            )
            if guarded(default):  # added to, never narrowed: Choir's own checks (trace,
                # mutants) are in no list a repo writes (``choir.config._loosened``)
                fields["verifiers"] = tuple(dict.fromkeys([*fields["verifiers"], *core]))
                fields["reruns"] = max(fields["reruns"], default.reruns)
            if not any(n in checks for n in fields["verifiers"]):
                # a list of the run's trace alone checks no code (review 20, F5): refused in
                # choir.yaml; a configuration built in code falls back as the defaults do
                fields["verifiers"] = (*checks, *fields["verifiers"])
            # tightened, never loosened, whatever the file's checks let through
            fields["allow_unsafe_isolation"] = (default.allow_unsafe_isolation
                                                and fields["allow_unsafe_isolation"])
            fields["require_limits"] = default.require_limits or fields["require_limits"]
        if fields["require_heldout"]:
            held = [n for n, spec in config.verifiers.items() if spec.heldout is not None]
            fields["verifiers"] = tuple(dict.fromkeys([*fields["verifiers"], *held]))
        moods[mood] = MoodPolicy(**fields)
    return Policy(
        moods=moods,
        approval_at=base.approval_at,
        same_signature_limit=base.same_signature_limit,
        halt_after=base.halt_after,
        nested_max=base.nested_max,
        max_parallel=config.max_parallel or base.max_parallel,
        max_mood_switches=base.max_mood_switches,
        split_depth=base.split_depth,
        escalate_to=base.escalate_to,
    )
