"""Whatever text a verifier writes, the runner reads no command from it (a port of its parser).

Any string: relayed to the log it drives nothing; put in an annotation it stays that one
annotation's data and title; in the step summary it renders to no tag of its own.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choir._core.terminal import plain_lines
from choir.ci.github import annotation, defuse, relay
from choir.ci.summary import Outcome, markdown
from tests import ghrunner

# text rich in what the parser cares about
HOSTILE = st.lists(st.sampled_from(list(":#[]%,=;\r\n \t\u2003\u2028\x85<>&|*`")
                                   + ["::", "##[", "set-output", "add-mask", "name",
                                      "stop-commands", "error", "a", "é"]),
                   max_size=40).map("".join)
ALLOWED = {"h2", "h3", "p", "table", "tr", "th", "td", "pre"}


@settings(max_examples=300, deadline=None)
@given(HOSTILE)
def test_relayed_text_drives_nothing(text: str) -> None:
    assert ghrunner.commands(defuse(text)) == []
    out = io.StringIO()
    relay(out, text.split("\n"))
    assert ghrunner.commands(out.getvalue()) == []
    assert ghrunner.commands(out.getvalue().replace("\u2028", "\n")) == []


@settings(max_examples=300, deadline=None)
@given(HOSTILE, HOSTILE, HOSTILE)
def test_an_annotation_is_one_command_whatever_its_fields(message: str, title: str,
                                                          file: str) -> None:
    line = annotation("error", message, title=title, file=file or None, line=3)
    assert "\n" not in line and "\r" not in line
    [(name, props, data)] = ghrunner.commands(line)
    assert name == "error"
    assert data == plain_lines(message)
    assert set(props) <= {"file", "line", "title"}
    assert props.get("file", "") == file.strip()
    assert props.get("line") == ("3" if file.strip() else None)
    assert props.get("title", "") == plain_lines(title).strip()


@settings(max_examples=150, deadline=None)
@given(HOSTILE, HOSTILE)
def test_the_summary_renders_no_tag_of_a_verifier(summary: str, test: str) -> None:
    contract = {"run_id": "verify-1", "status": "FAIL", "verdict": "FAIL", "mood": "CALM",
                "reports": [{"verifier": "unit", "result": "FAIL", "summary": summary}],
                "threads": [{"replica": 0}], "attestations": [],
                "failing_tests": [{"verifier": "unit", "node_id": test, "location": test,
                                   "excerpt": summary}]}
    text = markdown(Outcome(verify_code=1, contract=contract, gate_code=1,
                            gate_lines=[summary]), claim="ci")
    tags, _ = ghrunner.summary_tags(text)
    assert {t for t, _ in tags} <= ALLOWED
    assert [t for t, _ in tags].count("table") == 2 and [t for t, _ in tags].count("h2") == 1
    assert all(not attrs for _, attrs in tags)


def test_a_refused_unisolated_run_never_reads_gate_open() -> None:
    """Found by a review: the summary said ``Gate: open`` for a run refused for having no
    isolation (the gate itself had opened), beside status FAIL and the output ``refused``."""
    from choir.ci.summary import plain

    contract = {"run_id": "verify-1", "status": "PASS", "verdict": "PASS", "mood": "CALM",
                "reports": [], "threads": [], "attestations": []}
    outcome = Outcome(verify_code=0, contract=contract, gate_code=0, unisolated=True)
    assert outcome.status == "FAIL"
    assert "### Gate: refused" in markdown(outcome, claim="ci")
    assert "gate ci: refused" in plain(outcome, claim="ci")


def test_a_line_number_is_ascii_digits_and_a_name_is_text(tmp_path: Path) -> None:
    """Found by a review: ``FAILED data.txt:²`` in a test's output crashed the CI entry after
    the verify (``"²".isdigit()``, then ``int``), and a test renamed to reach a file whose
    name is not UTF-8 crashed writing the summary: no status, no upload."""
    from choir.ci import repo_location

    (tmp_path / "data.txt").write_text("x\n")
    assert repo_location("data.txt:²", tmp_path) == ("data.txt", None)
    assert repo_location("data.txt:12", tmp_path) == ("data.txt", 12)
    assert repo_location("data.txt:" + "9" * 40, tmp_path) == ("data.txt", None)
    name = b"caf\xe9.py".decode("utf-8", "surrogateescape")
    shown = plain_lines(f"FAILED {name}::test_x")
    assert shown.encode("utf-8") == b"FAILED caf\\udce9.py::test_x"


def test_a_crash_while_reporting_still_writes_the_outputs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The outputs (status, paths for the upload) are written whatever the report did: a
    crash there left ``status`` empty and the evidence not uploaded. It reads ERROR."""
    import choir.ci as ci
    from choir.ci.steps import Options

    def boom(*_args: object, **_kwargs: object) -> str:
        raise RuntimeError("the summary broke")

    monkeypatch.setattr(ci, "markdown", boom)
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "output"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    contract = {"run_id": "verify-1", "status": "PASS", "verdict": "PASS", "tail_log": ""}
    outcome = Outcome(verify_code=0, contract=contract, gate_code=0)
    (tmp_path / "out").mkdir()
    with pytest.raises(RuntimeError):
        ci._report_github(outcome, Options(repo=tmp_path, out=tmp_path / "out"))
    out = ghrunner.outputs(tmp_path / "output")
    assert out["status"] == "ERROR" and out["gate"] == "refused"
    assert str(tmp_path / "out") in out["paths"]
