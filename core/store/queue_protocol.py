"""The store's queue and what several workers share (docs/durability.md#the-queue,
docs/scale-out.md): `WorkerStore`, which every backend implements (the one dispatcher
claims from it in one process too), and `SharedStore`, which only PostgreSQL does.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

from core.records import record
from core.store.rows import RunRow


@record(frozen=True, slots=True)
class WorkerState:
    """One worker as the shared store sees it (`SharedStore.worker_states`): seconds since
    its last heartbeat (None: not listed — struck off as dead, yet a lease of it has not
    expired) and since it joined, by the store's clock, and the leases it holds (name and
    the seconds each has left), by name."""

    id: str
    beat_age: float | None
    up_for: float | None
    leases: tuple[tuple[str, float], ...] = ()


class WorkerStore(Protocol):
    """The store's queue as the dispatcher hands it out (docs/durability.md#the-queue,
    docs/scale-out.md): queued runs one at a time per conversation, in order. Times are
    the store's clock (PostgreSQL's server clock), so workers' clocks need not agree.

    Like the other `async` writes, each also commits what was queued before it."""

    async def claim_queued_run(
        self, worker_id: str | None, *, shared: bool = True
    ) -> RunRow | None:
        """Committed: the oldest queued run of `worker_id` (see `create_run`; None: of no
        worker) — or, if `shared`, of no worker — whose
        conversation has no running run, nor an answer still owed (`owe_reply`: the next
        answer must not overtake it), nor a paused run (`waiting_on_human` and
        resumable: an interrupted run that waits for `/resume` or `/skip` holds the
        messages behind it), becomes `running` (`started_at` now) on
        `worker_id`; None if there is none. No two claims,
        from any workers, get the same run, nor two runs of one conversation while one
        runs; a conversation's runs are handed out in the order they were stored (`seq`,
        the store's own order, whatever the clocks of the workers that stored them)."""
        ...

    def set_worker(self, worker_id: str | None) -> None:
        """Runs this store creates running or resumes, and the tool groups it lists,
        are `worker_id`'s from now on (None: one process, nobody's)."""
        ...

    async def unclaim_run(self, run_id: str) -> None:
        """Committed: a claimed run that never began goes back to the queue (`queued`,
        no worker), unless it is no longer running."""
        ...

    async def take_resumable_run(
        self, run_id: str, worker_id: str | None, *, since: float = 0.0
    ) -> bool:
        """Committed: the interrupted run `run_id` (resumable, neither running nor
        queued) goes on: `running` on `worker_id`, no longer resumable — only if nothing
        else of its conversation is running, nor (unless the run is paused:
        `waiting_on_human`, holding its queue) queued since `since` (runs queued before
        it go after); whether it did. Of several takers at once, one gets it."""
        ...

    async def cancel_queued(
        self, conv: str, reason: str, *, run_id: str | None = None
    ) -> list[str]:
        """Committed: `conv`'s queued runs (only `run_id`, if given) become `cancelled`
        (`reason`); their ids, first stored first. A run claimed meanwhile is not among
        them."""
        ...


@runtime_checkable
class SharedStore(Protocol):
    """What only a store several workers share does (PostgreSQL; docs/scale-out.md): the
    take-in statement that stores a platform event's queued run exactly once across
    workers, heartbeats, the takeover of a dead worker's runs, and leases on singletons
    (`core.lease`). LISTEN/NOTIFY is
    `core.store.notify.open_notices`'s. One process (SQLite) has none of them: its
    dispatcher needs only `WorkerStore`.

    Like the other `async` writes, each also commits what was queued before it."""

    async def create_queued_run(
        self, run_id: str, conv: str, text: str, *, channel: str, event_id: str
    ) -> bool:
        """A `shared` queued user run for a platform event, marked seen in the same commit;
        False (and nothing created) if the event was seen already. Of several workers
        taking one event in at once (a redelivery while the first still stores it),
        exactly one creates the run."""
        ...

    async def take_over_runs(
        self,
        dead: str | None,
        worker_id: str,
        *,
        created_before: float = math.inf,
        silent_for: float | None = None,
    ) -> list[RunRow]:
        """Committed: the runs worker `dead` left running (None: runs of no worker, created
        before `created_before`) become `worker_id`'s and stay `running` (reason
        `taken_over`; resumable if their last checkpoint is not the final one), so that
        nothing of their conversations runs before the taker has gone on with them or
        paused them — except a user's or a goal's run with no checkpoint at all (it never
        got going): it goes back to the queue, as a run any worker may claim; and a child
        run, which becomes `timed_out` ("interrupted") for its parent to resume.

        `dead`'s row in the worker list goes in the same commit; with `silent_for`, only
        if `dead` has not beaten for that many seconds, else nothing is taken (a worker
        that beat meanwhile keeps its runs). Returns the runs, oldest first. Of workers
        taking over at once, each run goes to one."""
        ...

    async def worker_heartbeat(self, worker_id: str) -> bool:
        """Committed: `worker_id` is alive now. True if it was listed already; False if it
        was not — a new worker, or one taken for dead since its last heartbeat (its runs
        were taken over: `take_over_runs`), listed again from now."""
        ...

    async def dead_workers(self, older_than: float) -> list[str]:
        """Workers not heard from for more than `older_than` seconds, longest silent
        first."""
        ...

    async def worker_states(self) -> list[WorkerState]:
        """Every listed worker, the most recently heard from first, with the unexpired
        leases it holds; then any other holder of an unexpired lease (by id). Read only;
        ages are the store's clock (the operator's page, docs/operations.md)."""
        ...

    async def forget_worker(self, worker_id: str) -> None:
        """Committed: a dead worker's runs are reconciled; it is no longer listed."""
        ...

    async def take_lease(self, name: str, holder: str, ttl: float) -> bool:
        """Committed: `holder` holds the lease `name` for the next `ttl` seconds if it was
        free, expired or already `holder`'s; whether it holds it now. Of holders taking
        one lease at once, one gets it."""
        ...

    async def renew_lease(self, name: str, holder: str, ttl: float) -> bool:
        """Committed: `holder` keeps its lease `name` for the next `ttl` seconds; False if
        the lease is not `holder`'s (any more)."""
        ...

    async def release_lease(self, name: str, holder: str) -> None:
        """Committed: `holder` gives the lease `name` up (nothing if it is not its)."""
        ...


__all__ = ["SharedStore", "WorkerState", "WorkerStore"]
