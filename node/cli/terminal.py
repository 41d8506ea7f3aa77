"""The one `rich` console the ``tickwheel`` command prints to, whichever part of it runs
(`tickwheel.node.cli.commands` and its command groups, `tickwheel.cli`'s ``cluster up``)."""

from rich.console import Console

console = Console()
