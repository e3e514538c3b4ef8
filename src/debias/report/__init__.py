"""The report: metrics and runs collected (collect.py), figures, the report page (build.py), the compare page."""
