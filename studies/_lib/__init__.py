"""The report toolkit every study's report imports (``report.py``) and the run scripts' helper
(``study_run.sh``)."""
