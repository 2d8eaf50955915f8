import pathlib


def test_tree():
    here = pathlib.Path(".")
    if (here / "b.txt").exists():  # b must copy a: it needs a's change
        assert (here / "b.txt").read_text() == "A\n"
