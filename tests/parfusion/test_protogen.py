"""The committed stubs are exactly what `make proto` generates."""

from parfusion.protogen import main


def test_committed_stubs_are_fresh() -> None:
    assert main(["--check"]) == 0
