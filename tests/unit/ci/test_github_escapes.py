"""Whatever text a verifier writes, the runner reads no command from it (a port of its parser).

Any string: relayed to the log it drives nothing; put in an annotation it stays that one
annotation's data and title; in the step summary it renders to no tag of its own.
"""

from __future__ import annotations

import io

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
