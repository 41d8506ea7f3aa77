"""``tickwheel console``: the web console of a tickwheel cluster (docs/console.md).

Its own process, a program of the client library's as a user's would be: every page is read
from the cluster through `tickwheel.client`, with the logged-in principal's own token, so the
cluster's grants decide what each operator sees and may change (an import-linter contract
keeps this package off the server's). Served over TLS alone, by uvicorn (`console.serve`), as
a Starlette app (`console.app`): sessions and CSRF tokens (`console.sessions`), the pages
(`console.pages`, `console.actions`), what they read (`console.views`) and their live updates
by server-sent events (`console.live`). `tickwheel console` and ``tickwheel cluster up
--console`` (`tickwheel.cli`) run it; `make demo` prints where.
"""

from tickwheel.console.serve import ConsoleSettings, main, run

__all__ = ["ConsoleSettings", "main", "run"]
