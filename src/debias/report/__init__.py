"""The report: metrics and runs collected (collect.py), figures, the report page (build.py over document.py,
inputs.py, artifacts.py and one module per section in sections/), the compare page (compare*.py)."""
