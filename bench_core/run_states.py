"""The states of a benchmark run, a playground job and a sweep, defined once.

A run goes queued -> loading -> running -> finished | partial | failed | cancelled (see runner.py); a
playground job takes the same path without partial, and a sweep reports running, then finished, failed
or cancelled. The values are the strings the history's `status` column has always held, so rows written
before and after read alike.
"""

QUEUED = "queued"
LOADING = "loading"
RUNNING = "running"
FINISHED = "finished"
PARTIAL = "partial"  # ran to the end, but some requests failed
FAILED = "failed"  # no request succeeded, or the run broke
CANCELLED = "cancelled"

IMPORTED = "imported"  # a history row read from a CSV (LMDeploy's or another history), not run here

STATES = (QUEUED, LOADING, RUNNING, FINISHED, PARTIAL, FAILED, CANCELLED)
MEASURED = (FINISHED, PARTIAL)  # ran to the end with requests that succeeded: its numbers stand
