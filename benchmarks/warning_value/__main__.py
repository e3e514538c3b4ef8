"""``python -m benchmarks.warning_value``: the command line of :mod:`benchmarks.warning_value.runner`."""

import sys

from benchmarks.warning_value.runner import main

sys.exit(main())
