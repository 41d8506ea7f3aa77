"""``tickwheel console``: the web console (`tickwheel.console`, docs/console.md) in the
foreground, until Ctrl-C or SIGTERM. `tickwheel.cli.main` adds it to the node's commands; the
console's own settings and flags are `tickwheel.console.serve`'s."""

from __future__ import annotations

import argparse

from tickwheel.console.serve import add_arguments, run, settings_from


def add_console_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "console", help="serve the web console over HTTPS (docs/console.md)")
    add_arguments(parser)
    parser.set_defaults(handler=_console)


def _console(args: argparse.Namespace) -> int:
    run(settings_from(args))
    return 0
