"""The job store: the database is the record, Redis only the transport.

Every state change of a job goes through here. Writes made on behalf of a running attempt
are *fenced* by ``lease_token``: the token is bumped each time the job is (re)queued or
claimed, so an attempt whose lease was taken away (worker killed, paused, partitioned) can
never record a result, start a delivery or requeue the job. The lease itself is the one
chain runs have too (:mod:`jobs.queue.lease`).

The modules: ``claims`` (take and give back a lease), ``finishes`` (the fenced records of
an attempt), ``leases`` (renewal, expiry, take-over, the workers' rows), ``records`` (new
jobs), ``queries`` (reads and the queue's bookkeeping), ``actions`` (operator actions);
``sqlite`` holds the hot batches' forms for SQLite, ``tables`` what they share.
Callers use the names re-exported here.
"""

from jobs.queue.store.actions import cancel_queued, delete_finished, reopen, request_cancel
from jobs.queue.store.claims import (
    Claim,
    claim,
    claim_many,
    holds_lease,
    set_phase,
    unclaim,
)
from jobs.queue.store.finishes import (
    OUTPUT_TAIL_CHARS,
    Outcome,
    finish,
    finish_many,
    output_tail,
    record_output,
    requeue,
)
from jobs.queue.store.leases import (
    LOST_CAP_REASON,
    Renewal,
    expire_leases,
    fail_lost,
    live_peers,
    renew_leases,
    stale_owners,
    worker_heartbeat,
)
from jobs.queue.store.queries import (
    bump_queued,
    failed_job_ids,
    get_job,
    next_run_at,
    promote_due,
    recent_failures,
    stale_queued,
)
from jobs.queue.store.records import (
    NO_GENERATION,
    DispatchKeyRow,
    drop_unqueued,
    ensure_session,
    record_job,
    record_jobs,
)
from jobs.queue.store.tables import LEASES, RowView, arq_id

__all__ = [
    "LEASES",
    "LOST_CAP_REASON",
    "NO_GENERATION",
    "OUTPUT_TAIL_CHARS",
    "Claim",
    "DispatchKeyRow",
    "Outcome",
    "Renewal",
    "RowView",
    "arq_id",
    "bump_queued",
    "cancel_queued",
    "claim",
    "claim_many",
    "delete_finished",
    "drop_unqueued",
    "ensure_session",
    "expire_leases",
    "fail_lost",
    "failed_job_ids",
    "finish",
    "finish_many",
    "get_job",
    "holds_lease",
    "live_peers",
    "next_run_at",
    "output_tail",
    "promote_due",
    "recent_failures",
    "record_job",
    "record_jobs",
    "record_output",
    "renew_leases",
    "reopen",
    "request_cancel",
    "requeue",
    "set_phase",
    "stale_owners",
    "stale_queued",
    "unclaim",
    "worker_heartbeat",
]
