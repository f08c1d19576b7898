"""A command's arguments as its user meets them: what its parser says when
it refuses them."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def usage_error(
    parse_args: Callable[[list[str]], object], capsys: pytest.CaptureFixture[str], *argv: str
) -> str:
    """What ``parse_args`` wrote to stderr refusing ``argv``; fails the test
    unless it stopped with argparse's usage status (2)."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err
