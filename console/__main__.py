"""``python -m tickwheel.console``: the console alone (`tickwheel console` is the same)."""

import sys

from tickwheel.console.serve import main

sys.exit(main())
