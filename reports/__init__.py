"""Reports of a certification run: the `hilconform` command, the run folder, certificate, HTML, diff.

Reads what a run wrote (JUnit, measurements, progress, host records, runtime
events) and runs pytest as a process; never reaches into a live host.
"""
