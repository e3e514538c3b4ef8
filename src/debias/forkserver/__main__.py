"""``python -m debias.forkserver SOCKET [INTERPRETER OPTIONS]``: the server (started by the launcher)."""

import sys
from pathlib import Path

from debias.forkserver.server import serve

sys.exit(serve(Path(sys.argv[1]), sys.argv[2:]))
