import pathlib


def test_tree():
    here = pathlib.Path(".")
    for path in here.glob("*.txt"):  # no change may break the tree
        assert "BROKEN" not in path.read_text(), path
    if (here / "b.txt").exists():  # b must copy a: it needs a's change
        assert (here / "b.txt").read_text() == "A\n"
