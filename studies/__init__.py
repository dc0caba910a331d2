"""The studies: one folder per study (README, run script, report, committed results).

A package only so that a report run as ``python studies/<study>/report.py`` (which puts the
repository root on ``sys.path``) imports the shared toolkit as ``studies._lib.report``.
"""
