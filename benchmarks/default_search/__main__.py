"""``python -m benchmarks.default_search``: the command line of :mod:`benchmarks.default_search.runner`."""

import sys

from benchmarks.default_search.runner import main

sys.exit(main())
