"""``python -m tickwheel.audit DIR``: `tickwheel.audit.command`."""

import sys

from tickwheel.audit.command import main

sys.exit(main())
