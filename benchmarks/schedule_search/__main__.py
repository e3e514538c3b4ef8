"""``python -m benchmarks.schedule_search``: the command line of :mod:`benchmarks.schedule_search.runner`."""

import sys

from benchmarks.schedule_search.runner import main

sys.exit(main())
