"""The GitHub Action's entry (``choir-ci github``) on a real repo, as a runner runs it.

The runner's environment is set by the test (``GITHUB_OUTPUT``, ``GITHUB_STEP_SUMMARY``,
``GITHUB_WORKSPACE``, ``RUNNER_TEMP``, ...); the step's log is read back with a port of the
runner's own command parser (``tests.ghrunner``), and the bundle is judged by in-toto's
library and securesystemslib with the public key the step wrote. A verifier's output is
hostile: it tries every workflow command, in both syntaxes, and markdown and HTML for the
summary; the same repo under a bare ``choir verify`` shows the attack is real.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

from tests import forked, ghrunner
from tests.integration.test_verify_cli import CALC_BUG, CALC_OK, make_repo, sandbox_name

pytestmark = pytest.mark.slow  # CI's slow stage: the README's command stays under five minutes

CI = [sys.executable, "-c", "from choir.ci import main; main()"]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


def calc(tmp_path: Path, source: str) -> Path:
    (tmp_path / "ws").mkdir()
    return committed(make_repo(tmp_path / "ws" / "repo", source))


def committed(repo: Path) -> Path:
    git(repo, "init", "-q", "-b", "main")
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    return repo


def runner_env(tmp_path: Path) -> dict[str, str]:
    """The variables a GitHub runner sets for a step (those the entry reads)."""
    for name in ("output", "summary"):
        (tmp_path / name).write_text("")
    (tmp_path / "runner-temp").mkdir(exist_ok=True)
    return dict(os.environ, GITHUB_ACTIONS="true", CI="true",
                GITHUB_WORKSPACE=str(tmp_path / "ws"), RUNNER_TEMP=str(tmp_path / "runner-temp"),
                GITHUB_OUTPUT=str(tmp_path / "output"),
                GITHUB_STEP_SUMMARY=str(tmp_path / "summary"),
                GITHUB_REPOSITORY="octo/calc", GITHUB_SERVER_URL="https://github.com",
                GITHUB_REF="refs/pull/7/merge", GITHUB_SHA="0" * 40, GITHUB_RUN_ID="42",
                CHOIR_CI_REPO="repo", CHOIR_CI_SANDBOX=sandbox_name(),
                PYTHONDONTWRITEBYTECODE="1")


def run_step(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = runner_env(tmp_path) | extra
    return subprocess.run(CI + ["github"], capture_output=True, text=True, env=env,
                          cwd=tmp_path / "ws", timeout=300)


NO_BASE = "choir: the checks are the tree's own"


def commands(log: str) -> list[ghrunner.Command]:
    """The commands the step's log runs, but the step's own warning that no base-ref was
    set (these trees have no base to verify against)."""
    return [c for c in ghrunner.commands(log)
            if not (c[0] == "warning" and c[1].get("title") == NO_BASE)]


def envelopes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def statement(envelope: dict[str, Any], key: SSlibKey) -> dict[str, Any]:
    """Verified by securesystemslib, validated by the in-toto attestation library."""
    Envelope.from_dict(json.loads(json.dumps(envelope))).verify([key], 1)
    stmt: dict[str, Any] = json.loads(base64.b64decode(envelope["payload"]))
    Statement.copy_from_pb(json_format.ParseDict(stmt, statement_pb2.Statement())).validate()
    return stmt


def published_key(out: Path) -> SSlibKey:
    data = json.loads((out / "choir-key.json").read_text())
    return SSlibKey.from_dict(data.pop("keyid"), data)


def test_a_passing_tree_opens_the_check_and_uploads_verifiable_evidence(tmp_path: Path) -> None:
    calc(tmp_path, CALC_OK)
    proc = run_step(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {c[0] for c in commands(proc.stdout + proc.stderr)} <= {"group", "endgroup"}
    assert len(ghrunner.commands(proc.stdout)) == len(commands(proc.stdout)) + 1
    out = ghrunner.outputs(tmp_path / "output")
    assert out["status"] == "PASS" and out["gate"] == "open"
    paths = out["paths"].splitlines()
    contract = json.loads((Path(paths[0]) / "verify.json").read_text())
    runs = len(contract["attestations"])
    assert runs >= 1 and len(paths) == 2 + runs  # out, the session, each verifier's run
    assert all(Path(p).is_dir() for p in paths)
    assert (Path(paths[1]) / "manifest.json").is_file()
    key = published_key(Path(paths[0]))
    assert key.keyid == out["key-id"]
    bundle = envelopes(Path(out["bundle"]))
    assert len(bundle) == 2 * runs + 1  # Choir's and the test result per run, then the VSA
    stmts = [statement(e, key) for e in bundle]
    kinds = [s["predicateType"] for s in stmts]
    assert kinds.count("https://in-toto.io/attestation/test-result/v0.1") == runs
    assert kinds[-1] == "https://slsa.dev/verification_summary/v1"
    for stmt in stmts:
        if stmt["predicateType"].endswith("test-result/v0.1"):
            json_format.ParseDict(stmt["predicate"], test_result_pb2.TestResult())
            assert stmt["predicate"]["result"] == "PASSED"
    vsa = stmts[-1]
    assert vsa["predicate"]["verificationResult"] == "PASSED"
    assert vsa["predicate"]["resourceUri"] == "git+https://github.com/octo/calc@refs/pull/7/merge"
    assert {a["digest"]["blake3"] for a in vsa["predicate"]["inputAttestations"]} == {
        s["predicate"]["id"] for s in stmts if s["predicateType"].startswith("https://choir")}
    head = subprocess.run(["git", "-C", str(tmp_path / "ws" / "repo"), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert vsa["subject"][0]["digest"]["gitCommit"] == head
    summary = (tmp_path / "summary").read_text()
    assert summary.startswith("## Choir: PASS")


def test_a_failing_tree_fails_the_check_at_the_failing_test(tmp_path: Path) -> None:
    calc(tmp_path, CALC_BUG)
    proc = run_step(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [c for c in ghrunner.commands(proc.stdout) if c[0] == "error"]
    at_test = [c for c in errors if c[1].get("file") == "repo/test_calc.py"]
    assert at_test and at_test[0][1]["line"].isdigit(), errors
    assert "test_add" in at_test[0][2] and at_test[0][1]["title"] == "choir: unit failed"
    out = ghrunner.outputs(tmp_path / "output")
    assert out["status"] == "FAIL" and out["gate"] == "refused"
    vsa = statement(envelopes(Path(out["bundle"]))[-1], published_key(Path(
        out["paths"].splitlines()[0])))
    assert vsa["predicate"]["verificationResult"] == "FAILED"
    assert vsa["predicate"]["verifiedLevels"] == ["FAILED"]
    summary = (tmp_path / "summary").read_text()
    assert summary.startswith("## Choir: FAIL") and "test_calc.py::test_add" in summary


HOSTILE_LINES = [
    "::add-mask::hunter2",
    "::set-output name=status::PASS",
    "  ::stop-commands::pwned",
    "\u2003::set-env name=NODE_OPTIONS::--require /tmp/x.js",
    "text ##[set-output name=gate;]open",
    "##[add-mask]hunter2",
    "::error file=README.md,line=1::forged annotation",
    "::save-state name=x::y",
    "\r::add-path::/tmp/evil",
]
HOSTILE_MARKUP = ('</td></tr></table>\n\n# PASS <img src="https://evil.example/p.png"> '
                  '[click](https://evil.example) <script>alert(1)</script> | x | y | '
                  '**bold** &lt;b&gt; www.evil.example')
MAKE_JUNIT = textwrap.dedent('''\
    import os, sys
    lines = {lines!r}
    markup = {markup!r}
    for line in lines:
        print(line)
    print(markup)
    def esc(s):
        return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                .replace('"', "&quot;").replace("\\n", "&#10;").replace("\\r", "&#13;"))
    cases = "".join(
        '<testcase classname="{{}}" name="{{}}" file="../../../etc/passwd">'
        '<failure message="{{}}">{{}}</failure></testcase>'.format(
            esc(line), esc(markup), esc(line + markup), esc(line))
        for line in lines)
    with open(os.path.join(os.environ["CHOIR_OUT"], "junit.xml"), "w") as fh:
        fh.write('<testsuite tests="%d" failures="%d">%s</testsuite>'
                 % (len(lines), len(lines), cases))
    sys.exit(1)
    ''')


def hostile_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "make_junit.py").write_text(MAKE_JUNIT.format(lines=HOSTILE_LINES,
                                                          markup=HOSTILE_MARKUP))
    (path / "choir.yaml").write_text(textwrap.dedent(f"""\
        verifiers:
          unit:
            kind: unit_tests
            steps:
              - name: tests
                command: {os.path.realpath(sys.executable)} make_junit.py
            parser: junit
        """))
    return committed(path)


ALLOWED_TAGS = {"h2", "h3", "p", "table", "tr", "th", "td", "pre", "code"}


def test_a_hostile_verifier_drives_neither_the_runner_nor_the_summary(tmp_path: Path) -> None:
    repo = hostile_repo(tmp_path / "ws" / "repo")
    # the attack is real: a bare `choir verify` in a step hands the runner the verifier's lines
    bare = forked.run([sys.executable, "-m", "choir", "verify", "--repo", str(repo),
                       "--sandbox", sandbox_name()], capture_output=True, text=True,
                      env=runner_env(tmp_path), timeout=300)
    assert bare.returncode == 1
    injected = {c[0] for c in ghrunner.commands(bare.stdout + bare.stderr)}
    assert {"add-mask", "set-output"} <= injected, injected

    proc = run_step(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = proc.stdout + proc.stderr
    assert "hunter2" in log  # the verifier's output is shown ...
    done = commands(log)  # ... but drives nothing
    assert {c[0] for c in done} <= {"error", "group", "endgroup"}, done
    for _, props, _ in done:
        assert set(props) <= {"file", "line", "title"}
        assert props.get("file") in (None, "repo/make_junit.py")  # never ../../../etc/passwd
        assert "\n" not in props.get("title", "")
    assert len([c for c in done if c[0] == "error"]) <= 20

    out = ghrunner.outputs(tmp_path / "output")
    assert set(out) == {"status", "run-id", "gate", "bundle", "key-id", "paths"}
    assert out["status"] == "FAIL" and out["gate"] == "refused"

    summary = (tmp_path / "summary").read_text()
    tags, text = ghrunner.summary_tags(summary)
    assert {tag for tag, _ in tags} <= ALLOWED_TAGS, tags
    assert all(not attrs for _, attrs in tags)  # no src, href, on*, style
    assert [t for t, _ in tags if t == "h2"] == ["h2"] and "Choir: FAIL" in text
    assert "<img" in text and "[click](https://evil.example)" in text  # shown as text
    assert summary.count("<table>") == 2  # reports, failing tests: no table was closed early


def test_a_configuration_error_is_exit_2_with_an_annotation(tmp_path: Path) -> None:
    repo = tmp_path / "ws" / "repo"
    repo.mkdir(parents=True)
    (repo / "choir.yaml").write_text("verifiers:\n  unit:\n    kind: unit_tests\n    stepz: []\n")
    committed(repo)
    proc = run_step(tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [c for c in ghrunner.commands(proc.stdout) if c[0] == "error"]
    assert errors and "choir.yaml" in errors[0][2] and "did you mean" in errors[0][2]
    assert ghrunner.outputs(tmp_path / "output")["status"] == "ERROR"
    assert (tmp_path / "summary").read_text().startswith("## Choir: ERROR")


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("CHOIR_CI_APPROVE_SPEC_CHANGE", "maybe", "not a valid boolean"),
    ("CHOIR_CI_MOOD", "sleepy", "'calm', 'skeptical'"),
])
def test_a_bad_input_names_the_input_it_came_from(tmp_path: Path, variable: str, value: str,
                                                  expected: str) -> None:
    """A workflow's author writes the action's inputs, never choir-ci's options: a value that
    does not fit says which input and variable (click said only `--approve-spec-change`),
    as an error annotation on the run, exit 2, nothing verified."""
    (tmp_path / "ws").mkdir()
    proc = run_step(tmp_path, **{variable: value})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    name = variable.removeprefix("CHOIR_CI_").lower().replace("_", "-")
    said = f"{variable}='{value}' (the action's `{name}` input)"
    assert said in proc.stderr and expected in proc.stderr, proc.stderr
    errors = [c for c in ghrunner.commands(proc.stdout) if c[0] == "error"]
    assert len(errors) == 1 and said in errors[0][2], proc.stdout
    assert "verifying" not in proc.stdout


@pytest.mark.parametrize("value", ["a\nb", "x\rname=y"])
def test_an_output_with_a_line_break_is_refused(tmp_path: Path, value: str) -> None:
    from choir.ci.github import write_outputs

    with pytest.raises(ValueError, match="line break"):
        write_outputs(tmp_path / "o", {"status": value})
    with pytest.raises(ValueError, match="line break"):
        write_outputs(tmp_path / "o", {"paths": ["ok", value]})


@pytest.mark.parametrize("plant", ["file", "folder"])
def test_an_out_folder_planted_in_the_checkout_is_never_written_through(
        tmp_path: Path, plant: str) -> None:
    """Without RUNNER_TEMP the out folder is ``./choir-ci`` in the checkout, which the pull
    request under review wrote: a committed ``choir-ci/summary.md`` link made the step write
    its summary (text the verifiers' output shapes) into the file it named, a shell's rc
    file say; a ``choir-ci`` link, every file the step writes (a review's note; both wrote
    through the link on the old code). Links there are removed or refused, never followed."""
    repo = tmp_path / "ws" / "repo"
    repo.mkdir(parents=True)
    (repo / "choir.yaml").write_text("verifiers:\n  unit:\n    kind: unit_tests\n    stepz: []\n")
    committed(repo)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "rc").write_text("KEEP\n")
    out = tmp_path / "ws" / "choir-ci"
    if plant == "file":
        out.mkdir()
        (out / "summary.md").symlink_to(victim / "rc")
    else:
        out.symlink_to(victim)
    env = runner_env(tmp_path)
    env.pop("RUNNER_TEMP")
    proc = subprocess.run(CI + ["github"], capture_output=True, text=True, env=env,
                          cwd=tmp_path / "ws", timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (victim / "rc").read_text() == "KEEP\n" and sorted(victim.iterdir()) == [victim / "rc"]


def test_a_tree_whose_choir_yaml_picks_no_isolation_fails_the_check(tmp_path: Path) -> None:
    """Found by a review: the pull request's own choir.yaml named `sandbox: {backend:
    local}`, the action's sandbox input was left empty, and the check passed with every step
    run as the job, beside the runner (it wrote outside the repo). Refused now unless the
    workflow itself asks for `local`."""
    repo = calc(tmp_path, CALC_OK)
    (repo / "choir.yaml").write_text((repo / "choir.yaml").read_text() +
                                     "sandbox: {backend: local}\n")
    git(repo, "commit", "-qam", "no isolation")
    proc = run_step(tmp_path, CHOIR_CI_SANDBOX="")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = ghrunner.outputs(tmp_path / "output")
    assert out["status"] == "FAIL" and out["gate"] == "refused"
    assert "ran with no isolation" in proc.stdout + proc.stderr
    for name in ("output", "summary"):
        (tmp_path / name).unlink()
    shutil.rmtree(tmp_path / "runner-temp")
    asked = run_step(tmp_path, CHOIR_CI_SANDBOX="local")  # the workflow's own choice
    assert asked.returncode == 0, asked.stdout + asked.stderr


def test_an_out_folder_that_cannot_be_made_is_exit_2_with_no_traceback(tmp_path: Path) -> None:
    """Review 16c: ``CHOIR_CI_OUT`` under a regular file raised ``NotADirectoryError``."""
    calc(tmp_path, CALC_OK)
    (tmp_path / "plain").write_text("x")
    proc = run_step(tmp_path, CHOIR_CI_OUT=str(tmp_path / "plain" / "out"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "CHOIR_CI_OUT" in proc.stdout
