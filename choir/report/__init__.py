"""Reports: parsers, failure signatures, and the bounded VERIFICATION_REPORT."""

from choir.report.build import abuild_report, decide, deterministic_report
from choir.report.parsers import get_parser, parser_names, register_parser
from choir.report.signatures import canonicalize, signature_id

__all__ = [
    "abuild_report",
    "canonicalize",
    "decide",
    "deterministic_report",
    "get_parser",
    "parser_names",
    "register_parser",
    "signature_id",
]
