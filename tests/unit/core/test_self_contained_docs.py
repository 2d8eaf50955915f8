"""Docstrings and comments stand on their own: nothing in the package points at documents a
user of the installed package does not have (the design seeds, the team's shared notes, the
tracker's issue numbers: "issue #12" means nothing to a reader of the code)."""

from __future__ import annotations

import re
from pathlib import Path

import choir

OUTSIDE = re.compile(r"seed[ -]?0\d\d|§|\.\./shared|ARCHITECTURE\.md|PLATFORM\.md|STYLE\.md|"
                     r"CONTRACT\.md|issue ?#\d|\(#\d+(\.\d+)?\)|\(item \d", re.IGNORECASE)


def test_no_source_file_refers_to_documents_outside_the_repository() -> None:
    root = Path(choir.__file__).parent
    found = [f"{path.relative_to(root)}:{number}: {line.strip()[:80]}"
             for path in sorted(root.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if OUTSIDE.search(line)]
    assert not found, "point at docs/ instead:\n" + "\n".join(found)
