"""The built-in file tools inside the wall: every read, write and listing of a run is
done by a thread of that run's own, confined by the kernel with exactly the rules a tool
process of the run gets (`Jail.ruleset`): its workspace, its scratch dir and
`allowed_paths` read-write, its conversation's artifacts and the system dirs readable,
nothing else.

Landlock, `no_new_privs` and (through raw syscalls) the uid belong to one thread, and a
thread cannot leave its Landlock domain. So each run (each `ToolSite`) gets one worker
thread that enters the jail once, at the run's first file call, and then serves every
file call of the run. The path checks (core/sandbox/paths.py) still run first: they give
the model a clear reason. The thread is what holds when they miss (a symlink swapped in
after the check, `/proc/self/root/…`, a spelling they do not foresee).

Starting a thread takes 0.2–2 ms on a busy host, so a few are started ahead, idle and
unconfined, by a filler thread; a run takes one and confines it (~0.4 ms: its ruleset,
the user switch), again if its scratch or artifacts dir appears later (see `_open`). A
worker ends when its run ends (`release`); beyond `LIVE_MAX` at once the least recently
used ends, and a later call of its run confines another. Where the
kernel has no Landlock (or `sandbox = "off"`) the file calls run unconfined on the
default thread pool, behind the path checks alone, as start-up says.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from core.errors import ToolError
from core.sandbox.jail import Jail
from core.sandbox.paths import PathRules, root_prefixes
from core.sandbox.settings import SandboxSettings
from core.sandbox.site import ToolSite
from core.sandbox.spawn import confine_thread

T = TypeVar("T")
Outcome = tuple[bool, Any]  # (returned, the value or the exception)

LIVE_MAX = 1024
"""Confined workers kept at once (an idle thread holds ~20 KB)."""

SPARES = 2
"""Threads started ahead of the runs that will take them."""

REFILL_DELAY = 0.01
"""Seconds the filler waits after a spare was taken before starting the next."""


class _Worker:
    """One thread serving jobs in order until closed."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Any] | None]
        self._jobs = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="parley-files", daemon=True).start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, reply = job
            try:
                outcome: Outcome = (True, fn(*args))
            except BaseException as exc:  # handed to whoever waits for it
                outcome = (False, exc)
            reply(outcome)
            del job, fn, args, reply, outcome  # nothing of a finished call stays alive

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run `fn(*args)` on the thread; its outcome as a future of the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def reply(outcome: Outcome) -> None:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(_settle, future, outcome)

        self._jobs.put((fn, args, reply))
        return future

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the thread and wait for it here."""
        done = threading.Event()
        box: list[Outcome] = []

        def reply(outcome: Outcome) -> None:
            box.append(outcome)
            done.set()

        self._jobs.put((fn, args, reply))
        done.wait()
        returned, value = box[0]
        if not returned:
            raise value
        return value

    def close(self) -> None:
        """End the thread once the jobs already given are done."""
        self._jobs.put(None)


def _settle(future: asyncio.Future[Any], outcome: Outcome) -> None:
    if future.done():  # its caller was cancelled
        return
    returned, value = outcome
    if returned:
        future.set_result(value)
    else:
        future.set_exception(value)


class _Spares:
    """Started, idle threads; a filler thread starts the next one when one is taken."""

    def __init__(self) -> None:
        self._ready: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._wanted = threading.Semaphore(0)
        self._filler: threading.Thread | None = None
        self._lock = threading.Lock()

    def take(self) -> _Worker:
        try:
            worker = self._ready.get_nowait()
        except queue.Empty:
            worker = _Worker()
        with self._lock:
            if self._filler is None:
                self._filler = threading.Thread(
                    target=self._fill, name="parley-files-spares", daemon=True
                )
                self._filler.start()
            else:
                self._wanted.release()
        return worker

    def _fill(self) -> None:
        for _ in range(SPARES):
            self._ready.put(_Worker())
        while True:
            self._wanted.acquire()
            # Not while the run that took one confines it: both would want the GIL.
            time.sleep(REFILL_DELAY)
            self._ready.put(_Worker())


_SPARES = _Spares()


class FileJail:
    """The file tools' side of one run: its path rules and its confined worker."""

    def __init__(self, jail: Jail | None, sandbox: SandboxSettings, site: ToolSite) -> None:
        self.site = site
        self.rules = PathRules.of(sandbox, site)
        # The skill folders: the file tools may read them as bash may (docs/guide/safety.md).
        self.readable = root_prefixes(jail.readable) if jail is not None else ()
        # Weakly: the jail's collection ends this worker (see `_forget`).
        self._jail = weakref.ref(jail) if jail is not None and jail.enforced else None
        self._worker: _Worker | None = None
        self._missing: tuple[Path, ...] = ()  # the site's dirs that did not exist yet

    @property
    def confined(self) -> bool:
        """Whether the calls run under the kernel's rules (else the path checks alone)."""
        return self._jail is not None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the run's confined thread (unconfined where nothing is
        enforced); its exceptions propagate.

        Raises:
            ToolError: the worker could not enter the sandbox (nothing was run).
        """
        if self._jail is None:
            return await asyncio.to_thread(fn, *args)
        worker = self._worker
        if worker is None or any(path.exists() for path in self._missing):
            jail = self._jail()
            if jail is None:
                raise ToolError("the file tools' sandbox configuration is gone")
            worker = self._open(jail)
        return cast(T, await worker.submit(fn, *args))

    def _open(self, jail: Jail) -> _Worker:
        """Confine a worker to the site. The run's scratch dir and the conversation's
        artifacts dir are made by the first call that writes there (most runs make
        neither): until then the worker gets no rule for them, and once one appears the
        next call confines a new worker that has it."""
        self.close()
        site = self.site
        site.workspace.mkdir(parents=True, exist_ok=True)
        scratch, artifacts = (
            path if path is not None and path.is_dir() else None
            for path in (site.scratch, site.artifacts)
        )
        self._missing = tuple(
            path
            for path, kept in ((site.scratch, scratch), (site.artifacts, artifacts))
            if path is not None and kept is None
        )
        # No network for the file tools, whatever tools.network says: they never need it.
        ruleset = jail.ruleset(
            scratch, workspace=site.workspace, artifacts=artifacts, network=False
        )
        worker = _SPARES.take()
        try:
            # Waited for here, once per run: the ruleset fd must outlive it, and two first
            # calls of a run must not confine two workers.
            worker.call(confine_thread, ruleset, jail.run_as)
        except OSError as exc:
            worker.close()  # half-confined at best: never used
            raise ToolError(f"the file tools could not enter the sandbox: {exc}") from exc
        finally:
            os.close(ruleset)
        self._worker = worker
        if jail.run_as is not None:
            jail.own_tasks += 1
        return worker

    def close(self) -> None:
        """End the worker once its calls in flight are done."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None
            jail = self._jail() if self._jail is not None else None
            if jail is not None and jail.run_as is not None:
                jail.own_tasks -= 1


# Keyed by the jail's id, not the jail: a configuration dropped (a test's, a reloaded
# one) ends its workers when its jail is collected (`_forget`), instead of living on here.
_LIVE: OrderedDict[tuple[int, ToolSite], FileJail] = OrderedDict()
_WATCHED: set[int] = set()


def _forget(jail_id: int) -> None:
    _WATCHED.discard(jail_id)
    for key in [key for key in _LIVE if key[0] == jail_id]:
        _LIVE.pop(key).close()


def file_jail(jail: Jail, sandbox: SandboxSettings, site: ToolSite) -> FileJail:
    """The file tools' jail for the run at `site`, confined at its first call."""
    if not jail.enforced:
        return FileJail(jail, sandbox, site)  # path checks alone (its rules, no worker)
    key = (id(jail), site)
    found = _LIVE.get(key)
    if found is not None:
        _LIVE.move_to_end(key)
        return found
    if key[0] not in _WATCHED:
        _WATCHED.add(key[0])
        weakref.finalize(jail, _forget, key[0])
    found = _LIVE[key] = FileJail(jail, sandbox, site)
    if len(_LIVE) > LIVE_MAX:
        _LIVE.popitem(last=False)[1].close()
    return found


def release(site: ToolSite) -> None:
    """End the workers of the run at `site` (its run ended)."""
    for key in [key for key in _LIVE if key[1] == site]:
        _LIVE.pop(key).close()


__all__ = ["LIVE_MAX", "REFILL_DELAY", "SPARES", "FileJail", "file_jail", "release"]
