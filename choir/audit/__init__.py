"""Integrity audit: every stored hash, signature and AHDB event, re-derived."""

from choir.audit.integrity import AuditResult, audit

__all__ = ["AuditResult", "audit"]
