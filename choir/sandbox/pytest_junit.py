"""pytest with a light JUnit XML writer: the pytest preset's step, run inside the sandbox.

This file imports nothing from Choir and runs in the sandbox's own interpreter: the host puts
its source in ``$CHOIR_PYTEST`` (every step's environment, ``choir.sandbox.base.step_env``;
as a text constant, run from Choir's compiled copy of exactly that text when the step is
given one, ``base.PYTEST_STUB``) and the preset's step is ``python3 -c "$CHOIR_PYTEST"
-q``: pytest with every argument given after ``-c``, as ``python3 -m pytest`` would run
it, and its results written to ``$CHOIR_OUT/junit.xml`` in the layout of pytest's
``--junitxml`` with ``junit_family=xunit1`` (what the ``junit`` parser reads).

Why not pytest's own ``--junitxml``: it builds an element tree report by report (a node id
parsed, every name escaped by a regular expression, each report's element made), and on a
small suite that is most of what a step costs beyond pytest itself (slugify's 140 tests and
152 subtests: 11-25 ms of about 1 s, paired runs; this writer 0-3 ms). Here a report that
passed costs a dict lookup and an addition; names are escaped once per test, at the end.

What it keeps of pytest's: one ``<testcase>`` per test (subtests folded into it, one
``<failure>`` per failed subtest), ``classname``/``name``/``file``/``line``/``time``; a
failed call is a ``<failure>``, a failed setup or teardown an ``<error>``, a collection
failure an ``<error message="collection failure">``, a skip or an xfail a ``<skipped>``, an
xfail that passed under ``strict`` a ``<failure>``; a failure's ``message`` shortened by
the running pytest's own function (pytest 9's; pytest 8 kept it whole), and
``--junitprefix`` put before the class names; the suite's
``tests``/``failures``/``errors``/``skipped`` counted the way pytest counts them (every
report, so every subtest, is a test). Text that XML 1.0 cannot hold is shown as ``#xNN``, as
pytest does. What it leaves out: captured output and user properties (``record_property``),
which the parser never reads. pytest's own writer stays loaded (its fixtures and options
work) but writes nothing: ``--junitxml=`` is given last, so a ``--junitxml`` in the
project's ``addopts`` does not write into the read-only tree.

The verdict never rests on this file alone: the step's exit code decides first
(``choir.report.build``), and the parser counts failures from the elements as well as from
the totals, so a test can only add failures here, never hide one.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

# what pytest's ``bin_xml_escape`` replaces, as the small class it is (pytest writes it as
# the complement of what XML allows, which takes 4-5 ms to compile); compiled on first need
_ILLEGAL = "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]"


def _visible(text: object) -> str:
    """``text`` with what XML 1.0 cannot hold shown as ``#xNN`` (pytest's ``bin_xml_escape``)."""
    text = str(text)
    if text.isascii() and text.isprintable():  # a test's name, mostly: nothing to replace
        return text
    illegal = re.compile(_ILLEGAL)  # re's own cache keeps it
    if illegal.search(text) is None:
        return text
    return illegal.sub(lambda m: f"#x{ord(m.group()):02X}" if ord(m.group()) <= 0xFF
                        else f"#x{ord(m.group()):04X}", text)


def _text(text: object) -> str:
    return _visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attr(text: object) -> str:
    return (_text(text).replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;")
            .replace("\t", "&#09;"))


def _names(nodeid: str) -> tuple[str, str]:
    """``classname`` and ``name`` of a node id, as pytest's ``mangle_test_address``."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".").removesuffix(".py")
    return ".".join(names[:-1]), names[-1] + bracket + params


def _crash(report: object) -> str:
    longrepr = getattr(report, "longrepr", None)
    crash = getattr(longrepr, "reprcrash", None)
    message = getattr(crash, "message", None) if crash is not None else None
    return str(message if message is not None else longrepr)


def _short(message: str) -> str:
    """``message`` shortened for a ``message`` attribute as the pytest that runs shortens it
    (pytest 9: whole lines within 500 characters and a line saying so; pytest 8: not at
    all): the parser's failure signatures are made of it, so they stay those of pytest's own
    XML."""
    try:
        from _pytest.junitxml import shorten_message  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return message
    return str(shorten_message(message))


class _Case:
    __slots__ = ("duration", "file", "line", "problems")

    def __init__(self, file: str, line: int | None) -> None:
        self.file, self.line = file, line
        self.duration = 0.0
        self.problems: list[tuple[str, str, str, str]] = []  # (tag, type, message, text)


class JUnitWriter:
    """A pytest plugin: the run's results, as JUnit XML at ``path`` when the session ends."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cases: dict[str, _Case] = {}
        self.stats = {"passed": 0, "failure": 0, "error": 0, "skipped": 0}
        self.doubled = 0  # tests counted twice by pytest: a call that passed, a teardown error
        self.failed_calls: set[str] = set()
        self.called: set[str] = set()  # tests whose call ran to its report
        self.items: list[tuple[str, str, int | None]] = []  # collected: (nodeid, file, line)
        self.seconds: dict[str, _Case] = {}  # a teardown's error after a failed call
        self.start = time.time()
        self.prefix = ""  # --junitprefix, put before every classname as pytest does
        self.runs_calls = True  # False for --co, --setup-only, --setup-plan

    def _case(self, report: object) -> _Case:
        nodeid = str(getattr(report, "nodeid", ""))
        case = self.cases.get(nodeid)
        if case is None:
            location = getattr(report, "location", None) or (nodeid.split("::")[0], None)
            case = self.cases[nodeid] = _Case(str(location[0]), location[1])
        return case

    def pytest_configure(self, config: Any) -> None:
        self.prefix = getattr(config.option, "junitprefix", None) or ""
        option = config.option
        # a session that runs no test's call on purpose (--co, --setup-only, --setup-plan,
        # chosen by the pinned command or configuration): none is unfinished (review 17i)
        self.runs_calls = not any(getattr(option, name, False) for name in
                                  ("collectonly", "setuponly", "setupplan"))

    def pytest_collection_finish(self, session: Any) -> None:
        """The tests the session is to run (after deselection): one it ends without running
        is no pass (``_unfinished``)."""
        for item in getattr(session, "items", ()):
            location = getattr(item, "location", None) or (item.nodeid.split("::")[0], None)
            self.items.append((item.nodeid, str(location[0]), location[1]))

    def _add(self, case: _Case, tag: str, kind: str, message: str, text: str) -> None:
        self.stats["skipped" if tag == "skipped" else tag] += 1
        case.problems.append((tag, kind, message, text))

    def pytest_runtest_logreport(self, report: Any) -> None:
        when, nodeid = report.when, report.nodeid
        case = self.cases.get(nodeid) or self._case(report)  # made at setup, as pytest's
        if when == "call" and getattr(report, "context", None) is None:
            # the test's own call, not one of its subtests' (a SubtestReport, pytest's or
            # pytest-subtests', is a call report of the parent's node id with a context): a
            # test that ended the session after one subtest ran had "finished" (review 17i)
            self.called.add(nodeid)
        if report.passed:  # the common case: an addition or two
            case.duration += report.duration or 0.0
            if when == "call":
                self.stats["passed"] += 1
            return
        if report.failed:
            if when == "teardown" and nodeid not in self.failed_calls:
                self.doubled += 1  # pytest's count: its test element was opened already
            elif when == "teardown":  # pytest closes the element of a failed call and opens
                # a second one for the teardown's error: each is a problem of its own
                case = self.seconds.setdefault(nodeid, _Case(case.file, case.line))
            if when == "call":
                self.failed_calls.add(nodeid)
                if hasattr(report, "wasxfail"):
                    self._add(case, "skipped", "pytest.xfail",
                              "xfail-marked test passes unexpectedly", "")
                else:
                    self._add(case, "failure", "", _short(_crash(report)),
                              str(getattr(report, "longrepr", "")))
            else:
                self._add(case, "error", "",
                          _short(f'failed on {"teardown" if when == "teardown" else "setup"} '
                                 f'with "{_crash(report)}"'),
                          str(getattr(report, "longrepr", "")))
        else:  # skipped
            reason = getattr(report, "wasxfail", None)
            if reason is not None:
                self._add(case, "skipped", "pytest.xfail", str(reason).removeprefix("reason: "),
                          "")
            else:
                longrepr = getattr(report, "longrepr", None)
                if isinstance(longrepr, tuple) and len(longrepr) == 3:
                    file, line, why = longrepr
                    why = str(why).removeprefix("Skipped: ")
                    self._add(case, "skipped", "pytest.skip", why, f"{file}:{line}: {why}")
                else:
                    self._add(case, "skipped", "pytest.skip", str(longrepr), str(longrepr))
        case.duration += report.duration or 0.0

    def pytest_collectreport(self, report: object) -> None:
        if getattr(report, "passed", True):
            return
        case = self._case(report)  # its location is its file, as pytest writes it
        if getattr(report, "failed", False):
            self._add(case, "error", "", "collection failure", str(getattr(report, "longrepr", "")))
        else:
            self._add(case, "skipped", "", "collection skipped",
                      str(getattr(report, "longrepr", "")))

    def pytest_internalerror(self, excrepr: object) -> None:
        case = self.cases.setdefault("pytest::internal", _Case("", None))
        self._add(case, "error", "", "internal error", str(excrepr))

    def _element(self, parts: list[str], nodeid: str, case: _Case) -> None:
        classname, name = _names(nodeid)
        if self.prefix:
            classname = f"{self.prefix}.{classname}" if classname else self.prefix
        head = (f'<testcase classname="{_attr(classname)}" name="{_attr(name)}" '
                f'file="{_attr(case.file)}"'
                + (f' line="{int(case.line)}"' if case.line is not None else "")
                + f' time="{case.duration:.3f}"')
        if not case.problems:
            parts.append(head + " />")
            return
        body = []
        for tag, kind, message, text in case.problems:
            typed = f' type="{_attr(kind)}"' if kind else ""
            inner = _text(text)
            body.append(f'<{tag}{typed} message="{_attr(message)}">{inner}</{tag}>'
                        if inner else f'<{tag}{typed} message="{_attr(message)}" />')
        parts.append(head + ">" + "".join(body) + "</testcase>")

    def _unfinished(self) -> None:
        """A test the session was to run and did not run to the end of its call is a
        failure when nothing else failed: the code under test ended the session (a
        ``pytest.exit`` in the test, its fixture's setup or teardown, a profile hook between
        two tests) so that the failing tests never reported (reviews 17f, 17g). After a
        failure (``-x``, ``--maxfail``) the session already fails: the rest is left as is."""
        if not self.runs_calls:  # set up on purpose without a call: not run, not a pass
            for nodeid, made in self.cases.items():
                if not made.problems and nodeid not in self.called:
                    self._add(made, "skipped", "choir.no_call",
                              "not run: the session runs no test's call", "")
            return
        if self.stats["failure"] or self.stats["error"]:
            return
        for nodeid, file, line in self.items:
            case = self.cases.get(nodeid)
            if case is None:
                case = self.cases[nodeid] = _Case(file, line)
            if not case.problems and nodeid not in self.called:
                self._add(case, "failure", "choir.unfinished", "the test never finished: the "
                                                               "session ended before its end", "")

    def pytest_sessionfinish(self) -> None:
        self._unfinished()
        parts: list[str] = []
        for nodeid, case in self.cases.items():
            self._element(parts, nodeid, case)
            if nodeid in self.seconds:
                self._element(parts, nodeid, self.seconds[nodeid])
        stats = self.stats
        tests = sum(stats.values()) - self.doubled
        suite = (f'<testsuite name="pytest" errors="{stats["error"]}" '
                 f'failures="{stats["failure"]}" skipped="{stats["skipped"]}" '
                 f'tests="{tests}" time="{time.time() - self.start:.3f}">')
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as fh:
            fh.write('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
                     + suite + "".join(parts) + "</testsuite></testsuites>")


def _pass_hook() -> bool:
    """True unless the running session's configuration leaves ``enable_assertion_pass_hook``
    off (or none is found): its modules must be rewritten with the hook's calls."""
    for finder in sys.meta_path:
        config = getattr(finder, "config", None)
        if type(finder).__name__ == "AssertionRewritingHook" and config is not None:
            try:
                return bool(config.getini("enable_assertion_pass_hook"))
            except (ValueError, KeyError):
                return True
    return True


def _rewritten(folder: str, root: str) -> None:
    """Where this pytest looks for its rewritten test modules under ``root``: ``folder``,
    which Choir made read-only for this step with its own pytest
    (``choir/sandbox/rewritten.py``). pytest still checks each file (its version in the
    name, the source's hash in the header) and rewrites the module itself when one does not
    fit; every other module's cache is where pytest keeps it."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    own = getattr(rewrite, "get_cache_dir", None)
    if own is None or not hasattr(rewrite, "_fix_code_filename"):
        return  # a pytest that keeps another kind of file: it finds none of Choir's anyway
    base = os.path.join(root, "")
    answers: list[bool] = []

    def get_cache_dir(file_path: Any) -> Any:
        path = str(file_path)
        if path.startswith(base):
            if not answers:
                answers.append(_pass_hook())
            if not answers[0]:
                return type(file_path)(folder, os.path.dirname(path[len(base):]))
        return own(file_path)

    rewrite.get_cache_dir = get_cache_dir


def _compiled(folder: str, root: str) -> None:
    """Where this interpreter looks for the compiled code of a module under ``root``:
    ``folder``, which Choir made read-only for this step (``choir/sandbox/rewritten.py``),
    never the tree's own ``__pycache__``. The import system still checks each file (its
    magic number, the source's hash in the header) and compiles the source when one does not
    fit; every module elsewhere, and every one under ``-O``, is looked for where it always is."""
    try:
        from importlib import _bootstrap_external as external  # what the loaders call
    except ImportError:
        return
    own = getattr(external, "cache_from_source", None)
    tag = sys.implementation.cache_tag
    if own is None or tag is None:
        return
    base = os.path.join(root, "")

    def cache_from_source(path: Any, debug_override: Any = None, *,
                          optimization: Any = None) -> Any:
        text = os.fspath(path)
        parts = text[len(base):].split(os.sep)
        if (debug_override is None and optimization is None and not sys.flags.optimize
                and text.startswith(base) and text.endswith(".py")
                and all(parts) and not any(part.startswith(".") for part in parts[:-1])):
            # only a plain path below the root: never one with an empty part (``root//x``
            # would join as ``/x``, outside the folder), nor below a folder whose name
            # starts with a dot (``..``; ``.choir``, where the wrapper's own copy is): Choir
            # makes none for such a folder's modules
            return os.path.join(folder, *parts[:-1], f"{parts[-1][:-3]}.{tag}.pyc")
        return own(path, debug_override, optimization=optimization)

    external.cache_from_source = cache_from_source


def main() -> int:
    """pytest with ``sys.argv[1:]``, and the writer when ``$CHOIR_OUT`` is set."""
    if sys.path and sys.path[0] == "":  # as ``python3 -m``: the folder it started in
        sys.path[0] = os.getcwd()
    try:
        import pytest
    except ImportError:
        print(f"{sys.executable}: No module named pytest", file=sys.stderr)
        return 1
    folder, root = os.environ.get("CHOIR_PYTEST_PYC"), os.environ.get("CHOIR_PYTEST_ROOT")
    if folder and root:
        _compiled(folder, root)
        _rewritten(folder, root)
    out = os.environ.get("CHOIR_OUT")
    plugins = [JUnitWriter(os.path.join(out, "junit.xml"))] if out else []
    code = pytest.main([*sys.argv[1:], "--junitxml="], plugins=plugins)
    sys.stdout.flush()
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
