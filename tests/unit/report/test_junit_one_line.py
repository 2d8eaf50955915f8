"""A JUnit file of many failing cases on one line (review 20, finding 2).

Every failing case beyond the listed ones still built a signature whose citation hashed line
1 of its file: on one line, the whole file, once per case. 16,000 cases took 91 s on the
round's event loop. A case is now cited only when its signature will be listed, and a file's
first line is hashed once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from choir.evidence.artifacts import ArtifactStore
from choir.models.report import MAX_SIGNATURES
from choir.report.junit import parse_junit
from choir.report.parsers import ParseInput

CASES = 2000


def _one_line(n: int) -> bytes:
    case = '<testcase classname="t" name="c{0}"><failure message="m{0}">' + "x" * 400 + \
        "</failure></testcase>"
    body = "".join(case.format(i) for i in range(n))
    return (f'<testsuites><testsuite tests="{n}" failures="{n}">{body}</testsuite>'
            "</testsuites>").encode()


def test_a_one_line_junit_file_hashes_its_line_once_per_listed_case(
        choir_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ArtifactStore()
    artifacts = {"out/junit.xml": store.ingest_bytes(_one_line(CASES))}
    hashed: list[int] = []
    real = ArtifactStore.span_hash

    def counting(self: ArtifactStore, digest: str, start: int, end: int) -> str:
        hashed.append(start)
        return real(self, digest, start, end)

    monkeypatch.setattr(ArtifactStore, "span_hash", counting)
    began = time.monotonic()
    result = parse_junit(ParseInput(artifacts=artifacts, store=store, exit_codes=[1]))
    took = time.monotonic() - began
    assert len(hashed) <= 1, len(hashed)  # the file's line 1, once (was once per case)
    assert len(result.signatures) == MAX_SIGNATURES
    assert result.dropped == CASES - MAX_SIGNATURES and result.truncated
    assert result.counts.run == CASES and result.counts.failed == CASES
    cited = {s.citation for s in result.signatures}
    assert len(cited) == 1 and None not in cited  # every listed case still cites the file
    assert took < 3.0, took
