"""Run traces: recorded per run, exported as one JSON document, verified fail-closed.

The format and the checks: docs/trace.md.
"""

from choir.trace.export import export_run
from choir.trace.grounding import RecordSources
from choir.trace.model import Trace, trace_json_schema
from choir.trace.verify import (
    CHECKS,
    TRACE_CHECKS,
    TraceVerification,
    verify_trace,
    verify_trace_file,
)

__all__ = ["CHECKS", "TRACE_CHECKS", "RecordSources", "Trace", "TraceVerification",
           "export_run", "trace_json_schema", "verify_trace", "verify_trace_file"]
