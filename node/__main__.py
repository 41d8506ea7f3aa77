"""``python -m tickwheel.node ...`` is the ``tickwheel`` command (see `tickwheel.node.cli`)."""

import sys

from tickwheel.node.cli import main

if __name__ == "__main__":
    sys.exit(main())
