"""Frozen pydantic models for everything Choir saves, hashes, signs or checkpoints."""

from choir.models.atom import Atom, AtomKind, AtomStatus
from choir.models.attestation import Attestation, AttestationBody, Environment
from choir.models.manifest import AppliedLimits, CommandRecord, Platform, RunManifest
from choir.models.report import (
    Citation,
    Counts,
    FailureSignature,
    Result,
    Target,
    Usage,
    VerificationReport,
)
from choir.models.verifier import (
    Lens,
    Lenses,
    Limits,
    PlannedVerifier,
    StepSpec,
    VerifierKind,
    VerifierPlan,
    VerifierSpec,
)
from choir.models.violation import Violation
from choir.models.workitem import BlastRadius, ExecutorSpec, Mood, WorkItem

__all__ = [
    "Atom",
    "AtomKind",
    "AtomStatus",
    "Attestation",
    "AttestationBody",
    "BlastRadius",
    "Citation",
    "AppliedLimits",
    "CommandRecord",
    "Counts",
    "Environment",
    "ExecutorSpec",
    "FailureSignature",
    "Lens",
    "Lenses",
    "Limits",
    "Mood",
    "Platform",
    "PlannedVerifier",
    "Result",
    "RunManifest",
    "StepSpec",
    "Target",
    "Usage",
    "VerificationReport",
    "VerifierKind",
    "VerifierPlan",
    "VerifierSpec",
    "Violation",
    "WorkItem",
]
