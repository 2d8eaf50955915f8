"""Frozen pydantic models for everything Choir saves, hashes, signs or checkpoints."""

from choir.models.atom import Atom, AtomKind, AtomStatus
from choir.models.attestation import (
    Attestation,
    AttestationBody,
    Environment,
    SpecChange,
)
from choir.models.manifest import AppliedLimits, CommandRecord, Interpreter, Platform, RunManifest
from choir.models.plan import PartSpec, PlanRecord, PlanRow, QueueEntry, Spend
from choir.models.report import (
    Citation,
    Counts,
    FailureSignature,
    Result,
    Target,
    Usage,
    VerificationReport,
    VerifierHistory,
)
from choir.models.run import ExecutorIsolation, ExecutorOutput, ParentFrame, VerifierRun
from choir.models.verifier import (
    HeldOut,
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
    "AppliedLimits",
    "Atom",
    "AtomKind",
    "AtomStatus",
    "Attestation",
    "AttestationBody",
    "BlastRadius",
    "Citation",
    "CommandRecord",
    "Counts",
    "Environment",
    "ExecutorIsolation",
    "ExecutorOutput",
    "ExecutorSpec",
    "FailureSignature",
    "HeldOut",
    "Interpreter",
    "Lens",
    "Lenses",
    "Limits",
    "Mood",
    "ParentFrame",
    "PartSpec",
    "PlanRecord",
    "PlanRow",
    "PlannedVerifier",
    "Platform",
    "QueueEntry",
    "Result",
    "RunManifest",
    "SpecChange",
    "Spend",
    "StepSpec",
    "Target",
    "Usage",
    "VerificationReport",
    "VerifierHistory",
    "VerifierKind",
    "VerifierPlan",
    "VerifierRun",
    "VerifierSpec",
    "Violation",
    "WorkItem",
]
