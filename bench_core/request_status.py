"""The status of one request in the per-request table; only SUCCESS requests count in LMDeploy's metrics."""

SUCCESS = "success"  # finished successfully with at least the requested number of tokens
INCOMPLETE = "incomplete"  # finished successfully but with fewer tokens than requested
FAILED = "failed"
UNFINISHED = "unfinished"  # never finished: still running, or never sent (a duration ended)
CANCELLED = "cancelled"  # stopped by the user's cancel, running or waiting: not an engine failure
OVERRUN = "overrun"  # served with more tokens than requested: a server that ignored the token limit
STATUSES = (SUCCESS, FAILED, INCOMPLETE, UNFINISHED, CANCELLED, OVERRUN)
