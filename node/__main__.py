"""``python -m tickwheel.node ...``: the node's commands of the ``tickwheel`` command (see
`tickwheel.node.cli.commands`); everything but ``cluster up``, which starts processes from the
layer above (`tickwheel.cli`)."""

import sys

from tickwheel.node.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
