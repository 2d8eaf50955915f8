"""Report parsers by name: they read artifacts, never trust them, and say when they truncate.

Each parser yields counts and failure signatures from a run's artifacts. Parsing is bounded:
lines are capped, signatures are capped (and the number dropped is reported), and XML is read
with entity and DTD handling refused. A parser that cannot read its input says so in
``error``: that can lower a result to INCONCLUSIVE, never raise it to PASS.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from choir._core.registry import PARSERS
from choir._core.terminal import strip_controls
from choir.models import Citation, Counts, FailureSignature
from choir.models.report import EXCERPT_MAX, MAX_SIGNATURES
from choir.report.signatures import canonicalize, signature_id

if TYPE_CHECKING:
    from choir.evidence.artifacts import ArtifactStore

LINE_MAX = 4096
WINDOW = 1 << 20  # bytes read at a time, whatever the line length
DENSE = 8  # a window where one line in this many may match is read line by line
COMBINED = "logs/combined.log"


@dataclass
class ParseInput:
    """What a parser may read: the run's files by relative path, and the store."""

    artifacts: dict[str, str]
    store: ArtifactStore
    exit_codes: list[int]


@dataclass
class ParseResult:
    counts: Counts = field(default_factory=Counts)
    signatures: list[FailureSignature] = field(default_factory=list)
    dropped: int = 0
    truncated: bool = False
    error: str | None = None
    # tests that ran to an outcome other than a skip or an xfail (None: the parser does not
    # count tests): a test parser's PASS needs one (``choir.report.build``)
    ran: int | None = None

    def keeps(self, sig_id: str) -> bool:
        """Whether a signature of id ``sig_id`` would be listed (not a repeat, not over the
        cap): what it costs to cite one is spent on those alone."""
        return len(self.signatures) < MAX_SIGNATURES and \
            all(s.id != sig_id for s in self.signatures)

    def add(self, sig: FailureSignature) -> None:
        if self.keeps(sig.id):
            self.signatures.append(sig)
        else:
            self.passed_over(sig.id)

    def passed_over(self, sig_id: str) -> None:
        """A signature ``keeps`` said no to, not built: a repeat of a listed one counts
        nothing; one past the cap is dropped (``truncated``)."""
        if all(s.id != sig_id for s in self.signatures):
            self.dropped += 1
            self.truncated = True


Parser = Callable[[ParseInput], ParseResult]


def register_parser(name: str) -> Callable[[Parser], Parser]:
    """Decorator: register a parser in this process (a plugin uses an entry point)."""
    registered: Callable[[Parser], Parser] = PARSERS.register(name)
    return registered


def get_parser(name: str) -> Parser:
    """The parser by name, imported on first use.

    Raises:
        UnknownNameError: no built-in, plugin or registered parser has that name.
    """
    parser: Parser = PARSERS.get(name)
    return parser


def parser_names() -> list[str]:
    return PARSERS.names()


def _excerpt(text: str) -> str:
    """Text to quote from a failure: canonical, without any control sequence or character
    (it reaches prompts, feedback files and CI summaries, where nothing strips them), and
    cut with a mark."""
    clean = strip_controls(canonicalize(text, limit=EXCERPT_MAX * 2))
    return clean[: EXCERPT_MAX - 1] + "…" if len(clean) > EXCERPT_MAX else clean


def _lines(inp: ParseInput, rel: str):  # type: ignore[no-untyped-def]
    digest = inp.artifacts.get(rel)
    if digest is None:
        return
    with inp.store.open(digest) as fh:
        yield from bounded_lines(fh)


def bounded_lines(fh: BinaryIO) -> Iterator[tuple[int, str, int]]:
    """``(number, first LINE_MAX bytes as text, full length)`` per line, reading windows of
    at most ``WINDOW`` bytes: a 1 GiB line without a newline costs one window, not 1 GiB."""
    number, head, size = 1, b"", 0
    for chunk in iter(lambda: fh.read(WINDOW), b""):
        start = 0
        while True:
            cut = chunk.find(b"\n", start)
            piece = chunk[start:] if cut < 0 else chunk[start:cut + 1]
            if len(head) < LINE_MAX:
                head += piece[:LINE_MAX - len(head)]
            size += len(piece)
            if cut < 0:
                break
            yield number, _text(head), size
            number, head, size, start = number + 1, b"", 0, cut + 1
    if size:
        yield number, _text(head), size


@dataclass(frozen=True)
class Maybe:
    """Where a test over a line's text could match, over a window of ASCII bytes."""

    pattern: re.Pattern[bytes]  # searched over the window (lower-cased first with ``fold``)
    words: tuple[bytes, ...]  # a window holding none of them has no match (a quick test)
    fold: bool = False  # for a case-insensitive test: the pattern is in lower case


@dataclass
class Tally:
    """What a pass over every line of a log found beside its candidates."""

    last: int = 0  # the last line's number (0: an empty log)
    truncated: bool = False  # a line longer than LINE_MAX


def _candidates(inp: ParseInput, rel: str, maybe: Maybe,
                tally: Tally) -> Iterator[tuple[int, str]]:
    digest = inp.artifacts.get(rel)
    if digest is None:
        return
    with inp.store.open(digest) as fh:
        yield from candidate_lines(fh, maybe, tally)


def candidate_lines(fh: BinaryIO, maybe: Maybe,
                    tally: Tally) -> Iterator[tuple[int, str]]:
    """``(number, text)`` as ``bounded_lines`` gives them, for every line a test over its text
    could pick, in order; ``tally`` counts them all.

    ``maybe``, searched over a window's bytes, must match wherever that test would (over
    ASCII bytes, a word matches as over their text). Lines in a
    window of ASCII where it matches nothing are counted, not decoded: a 10 MiB log of short
    lines took seconds through ``bounded_lines``. A window with other bytes, and a line that
    spans two windows, are read line by line. Memory stays one window.
    """
    number, head, size = 1, b"", 0  # the line being read: its number, first bytes, length
    for chunk in iter(lambda: fh.read(WINDOW), b""):
        first = chunk.find(b"\n")
        if first < 0:  # the line goes on past this window
            head += chunk[:max(0, LINE_MAX - len(head))]
            size += len(chunk)
            continue
        head += chunk[:min(first + 1, max(0, LINE_MAX - len(head)))]
        size += first + 1
        tally.truncated |= size > LINE_MAX
        yield number, _text(head)
        end = chunk.rfind(b"\n")
        number = yield from _whole_lines(chunk[first + 1:end + 1], number + 1, maybe, tally)
        head, size = chunk[end + 1:end + 1 + LINE_MAX], len(chunk) - end - 1
    if size:
        tally.truncated |= size > LINE_MAX
        yield number, _text(head)
        number += 1
    tally.last = number - 1


def _text(head: bytes) -> str:
    return head.decode("utf-8", "replace").rstrip("\r\n")


def _whole_lines(body: bytes, number: int, maybe: Maybe,
                 tally: Tally) -> Generator[tuple[int, str], None, int]:
    """The candidates among ``body``'s lines (each ends with a newline), the first numbered
    ``number``; returns the number of the line after them. Where candidates are dense (or
    the bytes are not ASCII) every line is given: cheaper than finding each."""
    if not tally.truncated:
        tally.truncated = _has_long_line(body)
    start, lines = 0, body.count(b"\n")
    if body.isascii():
        text = body.lower() if maybe.fold else body  # ASCII: each byte stays where it was
        if not any(word in text for word in maybe.words):
            return number + lines
        if sum(map(text.count, maybe.words)) * DENSE < lines:
            while (match := maybe.pattern.search(text, start)) is not None:
                begin = body.rfind(b"\n", 0, match.start()) + 1
                cut = body.find(b"\n", match.start())
                number += body.count(b"\n", start, begin)
                yield number, _text(body[begin:min(cut + 1, begin + LINE_MAX)])
                number, start = number + 1, cut + 1
            return number + body.count(b"\n", start)
    for at in range(number, number + lines):
        cut = body.find(b"\n", start) + 1
        yield at, _text(body[start:min(cut, start + LINE_MAX)])
        start = cut
    return number + lines


def _has_long_line(body: bytes) -> bool:
    """Whether a line of ``body`` (whole lines) is longer than LINE_MAX with its newline.
    Such a line holds a whole block of LINE_MAX // 2 bytes without a newline, at a multiple
    of that size: only those blocks are measured."""
    step = LINE_MAX // 2
    for at in range(0, len(body), step):
        if body.find(b"\n", at, at + step) < 0:
            begin = body.rfind(b"\n", 0, at) + 1
            if body.find(b"\n", at + step) + 1 - begin > LINE_MAX:
                return True
    return False


def _cite(inp: ParseInput, rel: str, start: int, end: int) -> Citation | None:
    digest = inp.artifacts.get(rel)
    if digest is None:
        return None
    return Citation(artifact=digest, line_start=start, line_end=end,
                    span_hash=inp.store.span_hash(digest, start, end))


def _find_line(inp: ParseInput, needle: str) -> int | None:
    for number, line, _ in _lines(inp, COMBINED) or ():
        if needle in line:
            return int(number)
    return None


_ERROR_LINE = re.compile(r"(error|exception|traceback|failed|fatal|panic|assert)", re.I)
_MAYBE_ERROR = Maybe(re.compile(_ERROR_LINE.pattern.encode()), fold=True,
                     words=tuple(_ERROR_LINE.pattern.strip("()").encode().split(b"|")))


def parse_generic(inp: ParseInput) -> ParseResult:
    """Exit codes plus the last error-looking lines of the combined log."""
    result = ParseResult()
    if not inp.exit_codes or all(code == 0 for code in inp.exit_codes):
        return result
    hits: list[tuple[int, str]] = []
    tally = Tally()
    for number, line in _candidates(inp, COMBINED, _MAYBE_ERROR, tally):
        if _ERROR_LINE.search(line) and not line.startswith("$ "):
            hits.append((number, line))
            hits = hits[-3:]
    last = tally.last
    result.truncated |= tally.truncated
    if not hits and last:
        hits = [(last, "")]
    for number, line in hits:
        message = canonicalize(line)
        result.add(FailureSignature(
            id=signature_id("generic", None, None, message or f"exit {inp.exit_codes[-1]}"),
            kind="exit_code", excerpt=_excerpt(line),
            citation=_cite(inp, COMBINED, number, number)))
    return result


_PYTEST_FAIL = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")
# where either can match, over a window's bytes (``candidate_lines``)
_MAYBE_PYTEST = Maybe(re.compile(rb"(?m)^(?:FAILED|ERROR) |in \d"),
                      words=(b"FAILED ", b"ERROR ", b"in "))
_PYTEST_SUMMARY = re.compile(
    r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|subtests passed|subtests skipped)")


def parse_pytest_text(inp: ParseInput) -> ParseResult:
    """pytest's short summary lines (``-ra``/``-q`` output) as a fallback to JUnit XML."""
    result = ParseResult()
    counts: dict[str, int] = {}
    for number, line in _candidates(inp, COMBINED, _MAYBE_PYTEST, Tally()):
        match = _PYTEST_FAIL.match(line)
        if match:
            test_id, message = match.group(2), match.group(3) or match.group(1)
            result.add(FailureSignature(
                id=signature_id("test", test_id, None, message), kind="test",
                test_id=test_id[:256], location=test_id.split("::")[0][:256],
                excerpt=_excerpt(message),
                citation=_cite(inp, COMBINED, number, number)))
        if re.search(r"\bin \d+(\.\d+)?s\b", line):
            found = {k.rstrip("s") if k.startswith("error") else k: int(n)
                     for n, k in _PYTEST_SUMMARY.findall(line)}
            if found:
                counts = found
    if counts:
        # as pytest's JUnit XML counts: every subtest is a test, an xfail is a skip (``run``
        # leaves the plain skips out: a test that passed and errored at teardown is counted
        # twice in the summary, once in JUnit's ``tests``, and so the totals meet)
        skipped = counts.get("skipped", 0) + counts.get("xfailed", 0)
        run = sum(v for k, v in counts.items() if k not in ("skipped", "subtests skipped"))
        result.counts = Counts(run=run, failed=counts.get("failed", 0),
                               errors=counts.get("error", 0), skipped=skipped)
        result.ran = run - counts.get("xfailed", 0)
    elif inp.exit_codes and inp.exit_codes[-1] != 0 and not result.signatures:
        return parse_generic(inp)
    else:  # a session that never printed its summary (it ended inside a test) decides nothing
        result.error = ("no pytest summary line in the log: the session did not finish, or "
                        "its summary was turned off (-qq, -p no:terminal); the pytest preset "
                        "(or parser: junit with its JUnit XML) reads how each test ended")
    return result


JSON_MAX = 8 << 20  # a JSON document larger than this is not read (the parser says so)


def json_objects(inp: ParseInput, suffix: str, limit: int = JSON_MAX,
                 unread: list[str] | None = None) -> list[tuple[str, object]]:
    """Parse every ``out/*suffix`` artifact as JSON (bounded size). One that is larger than
    ``limit`` or not JSON is skipped, and named in ``unread`` when given (a caller whose
    verdict rests on these files must not decide without one of them)."""
    found: list[tuple[str, object]] = []
    for rel, digest in sorted(inp.artifacts.items()):
        if rel.startswith("out/") and rel.endswith(suffix):
            data = inp.store.read_bytes(digest, limit=limit + 1)
            try:
                if len(data) > limit:
                    raise ValueError(f"larger than {limit >> 20} MiB")
                found.append((rel, json.loads(data)))
            except ValueError as exc:
                if unread is not None:
                    unread.append(f"{rel} ({str(exc)[:120]})")
    return found

