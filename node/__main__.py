"""``python -m tickwheel.node serve ...`` (see `tickwheel.node.serve`)."""

import sys

from tickwheel.node.serve import main

if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        raise SystemExit("usage: python -m tickwheel.node serve --self RAFT --member RAFT=GRPC "
                         "... --data DIR")
    sys.exit(main(sys.argv[2:]))
