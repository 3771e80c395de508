"""Wire contracts and fixed numbers: arq function names, Redis key names, the run cap. Renaming Python functions must
never strand queued work, so these strings are fixed here and nowhere else."""

from __future__ import annotations

# SPEC §7: a transient failure is re-run, at most this many runs in all (jobs and chain steps).
MAX_RUNS = 3

# arq job functions.
FN_RUN_JOB = "skilljobs.run"  # args: (job_id: str, lease_token: int)
FN_RUN_CHAIN = "skilljobs.chain"  # args: (run_id: str,)
# Queue priorities, 0 served first, 9 last (SPEC §10 dispatch ``priority``).
PRIORITY_INTERACTIVE = 3  # a chat dispatch without its own priority
PRIORITY_CHAIN = 6  # chain runs, scheduled or manual

# Our own Redis keys, under Settings.redis_prefix (see Settings.key()).
WAKE_CHANNEL = "wake"  # pub/sub: a job was enqueued — idle workers poll now
SESSION_EVENTS = "session"  # pub/sub: session:<session_id> — live web messages
JOB_EVENTS = "events:jobs"  # pub/sub: job status changes for the dashboard
WORKER_HEARTBEAT = "worker"  # worker:<id> → heartbeat JSON with TTL
WORKER_PAUSE = "worker-pause"  # worker-pause:<id> set → that worker claims no new jobs
WORKER_DRAIN = "worker-drain"  # worker-drain:<id> set → claims nothing, finishes, exits
CANCEL_CHANNEL = "cancel"  # pub/sub: job ids to cancel on whichever worker runs them
RATELIMIT_WAITS = "metrics:ratelimit-waits"  # hash channel → sends that waited for a token
RATELIMIT_WAITED = "metrics:ratelimit-waited"  # hash channel → seconds those sends waited
RATELIMIT_PARKED = "metrics:ratelimit-parked"  # hash channel → sends parked in the outbox
# Monotonic counters for /metrics (hashes, one field per label set, kept as long as Redis is)
JOBS_TOTAL = "metrics:jobs-total"  # "<skill>\t<status>" → jobs that ended so
DELIVERIES_TOTAL = "metrics:deliveries-total"  # "<channel>\t<status>" → deliveries that ended so
