"""The `parfusion` command. Subcommands come from command modules, each with `register(commands)`.

A command module lives beside the code it drives (services/<name>/commands.py,
experiments/commands.py) so a new command never edits this file's logic.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

COMMAND_MODULES = (
    "parfusion.commands",
    "services.allocator.commands",
    "services.bridge.commands",
    "services.extender.commands",
    "experiments.commands",
    "experiments.cpu_corun.commands",
    "experiments.gpu_corun.commands",
)

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


@dataclass
class _Group:
    parser: argparse.ArgumentParser
    sub: argparse._SubParsersAction  # type: ignore[type-arg]
    children: dict[str, _Group] = field(default_factory=dict)


class Commands:
    """Collects (path, help, configure, run) from command modules into nested argparse parsers."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._root = _Group(parser, parser.add_subparsers(dest="command", metavar="COMMAND"))

    def command(
        self, path: Sequence[str], help: str, configure: Configure | None, run: Run
    ) -> None:
        group = self._root
        for part in path[:-1]:
            if part not in group.children:
                p = group.sub.add_parser(part, help=f"{part} commands")
                group.children[part] = _Group(
                    p, p.add_subparsers(dest=f"{part}_command", metavar="COMMAND", required=True)
                )
            group = group.children[part]
        p = group.sub.add_parser(path[-1], help=help, description=help)
        if configure:
            configure(p)
        p.set_defaults(_run=run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parfusion", description="PARFusion cross-layer intent control plane"
    )
    commands = Commands(parser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that part of the product is not installed in this build
            raise
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    run = getattr(ns, "_run", None)
    if run is None:
        parser.print_help()
        return 2
    try:
        return int(run(ns) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader left (`parfusion intents | head -1`), which is not a failure: no traceback,
        # and stdout pointed at /dev/null so the interpreter's flush at exit cannot raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
