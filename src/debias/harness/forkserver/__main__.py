"""``python -m debias.harness.forkserver SOCKET [INTERPRETER OPTIONS]``: the server (started by the launcher);
``python -m debias.harness.forkserver --where``: the socket (and, beside it, the log) of this environment's server."""

import os
import sys
from pathlib import Path

from debias.harness.forkserver.protocol import interpreter_options, socket_path

if sys.argv[1:] == ["--where"]:
    where = socket_path(dict(os.environ), interpreter_options(list(sys.orig_argv)))
    print(where if where is not None else "no fork server for this environment (no private socket folder)")
    sys.exit(0)

from debias.harness.forkserver.server import serve  # noqa: E402

sys.exit(serve(Path(sys.argv[1]), sys.argv[2:]))
