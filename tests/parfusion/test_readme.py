"""The README shows exactly the commands the tests run verbatim, so the two cannot drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.allocator import test_grpcurl
from tests.extender import test_curl_examples

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.parametrize(
    "command",
    [
        *test_curl_examples.EXAMPLES,
        test_grpcurl.README_LIST,
        test_grpcurl.README_SUBMIT,
        test_grpcurl.README_PLAN,
        test_grpcurl.README_WATCH,
        test_grpcurl.README_POLL,
    ],
)
def test_tested_command_is_in_readme(command: str) -> None:
    assert command in README


def test_quick_start_is_two_commands() -> None:
    quick = README.split("## Quick Start", 1)[1].split("```", 2)[1]
    assert [line.split("#")[0].strip() for line in quick.strip().splitlines()[1:]] == [
        "make run",
        "make test",
    ]
