"""JUnit test names become pytest node ids with file:line, never reading outside the repo."""

from __future__ import annotations

from pathlib import Path

from choir.app.verify import pytest_node


def _repo(tmp_path: Path) -> Path:
    (tmp_path / "pkg" / "tests").mkdir(parents=True)
    (tmp_path / "pkg" / "tests" / "test_m.py").write_text(
        "import pytest\n\nclass TestA:\n    def test_x(self):\n        pass\n\n"
        "@pytest.mark.parametrize('n', [1])\nasync def test_p(n):\n    pass\n")
    return tmp_path


def test_junit_classnames_map_to_node_ids_with_def_lines(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    assert pytest_node(repo, "pkg.tests.test_m.TestA::test_x", None) == (
        "pkg/tests/test_m.py::TestA::test_x", "pkg/tests/test_m.py:4")
    assert pytest_node(repo, "pkg.tests.test_m::test_p[1]", None) == (
        "pkg/tests/test_m.py::test_p[1]", "pkg/tests/test_m.py:8")
    assert pytest_node(repo, "pkg/tests/test_m.py::TestA::test_x", None)[1] == \
        "pkg/tests/test_m.py:4"


def test_names_pointing_outside_the_repo_are_not_followed(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    (tmp_path / "secret.py").write_text("def test_s():\n    pass\n")
    for hostile in ("../secret.py::test_s", f"{tmp_path}/secret.py::test_s"):
        assert pytest_node(repo, hostile, None) == (hostile, None)
    assert pytest_node(repo, "x::test_s", "../secret.py") == ("x::test_s", "../secret.py")
    assert pytest_node(repo, "nowhere.mod::t", "nowhere/mod") == ("nowhere.mod::t", "nowhere/mod")


def test_a_name_reached_through_a_link_is_not_followed(tmp_path: Path) -> None:
    """Found by a review: a failing test renamed ``sub.link`` (``sub/link.py`` a link to a
    file whose name is not UTF-8) gave a node id the CI entry could not write."""
    repo = _repo(tmp_path / "repo")
    odd = repo / b"\xff.py".decode("utf-8", "surrogateescape")
    odd.write_text("def test_x():\n    pass\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "link.py").symlink_to(odd)
    (repo / "linked").symlink_to(repo / "pkg")
    assert pytest_node(repo, "sub.link::test_x", None) == ("sub.link::test_x", None)
    assert pytest_node(repo, "linked.tests.test_m.TestA::test_x", None)[1] is None
