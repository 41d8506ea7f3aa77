"""``tickwheel audit DIR``: the production audit of fetched ledgers (`tickwheel.audit`,
docs/audit.md). `tickwheel.cli.main` adds it to the node's commands; what follows ``audit``
(DIR first, then flags) goes to the audit's own parser (`tickwheel.audit.main`), loaded
only when the command runs: PySpark is the ``audit`` extra, which the node's image and other
commands do without (the command says so and exits 2 when it is missing)."""

from __future__ import annotations

import argparse
import sys


def add_audit_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "audit", add_help=False,
        help="audit fetched ledgers with Spark; exit 1 unless clean (docs/audit.md)")
    parser.add_argument("-h", "--help", action="store_true", dest="audit_help",
                        help="the audit's own help")
    parser.add_argument("arguments", nargs=argparse.REMAINDER,
                        help="DIR first, then the audit's flags")
    parser.set_defaults(handler=_audit)


def _audit(args: argparse.Namespace) -> int:
    try:
        from tickwheel.audit import main  # noqa: PLC0415 - pyspark is optional
    except ImportError as error:
        print(f"tickwheel audit needs the audit extra (pip install 'tickwheel[audit]'): "
              f"{error}", file=sys.stderr)
        return 2
    try:
        return main(["--help"] if args.audit_help else args.arguments)
    except SystemExit as exit_:  # argparse's --help and usage errors
        return exit_.code if isinstance(exit_.code, int) else 2
