"""``python -m tickwheel.cli ...``: the ``tickwheel`` command, as the console script runs it."""

import sys

from tickwheel.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
