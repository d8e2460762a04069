"""Streaming a reply into a chat: one post, throttled edits, then the final text (docs/channels.md).

A `Surface` is one place in one platform conversation (a chat, a thread) that can post,
edit and delete messages; the adapter maps its platform's errors onto `core.errors`:
`ChannelRateLimited` (429 with `retry_after`), `ChannelUnavailable` (5xx, connection
trouble) and `ChannelRefused`. Anything else a surface raises counts as a refusal too.

`ReplyStreamer` turns the agent's text deltas into that post-then-edit sequence and makes
sure the final text arrives whatever happened to the intermediate edits: calls for the
final text are retried by `channels.retry.call_with_retry`; an intermediate edit is tried
once (a later one shows newer text), though a 429 still silences the stream for its
`retry_after`.

Whatever is posted is first scrubbed of the configured secrets (`core.secrets`), so no
error text or answer carries a key into a chat.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from functools import partial
from types import TracebackType
from typing import Protocol, TypeVar

from channels.pacing import Pacer, before_first
from channels.retry import call_with_retry
from channels.status import status_line, with_status
from channels.text import split_message
from core.chat import is_silent, may_become_silent
from core.clock import Clock, SystemClock
from core.errors import (
    ChannelError,
    ChannelRateLimited,
    ChannelRefused,
    ChannelUnavailable,
    DeliveryFailed,
)
from core.events import LoopEvent, StreamRestarted, TextDelta
from core.secrets import scrub

log = logging.getLogger(__name__)

T = TypeVar("T")


class Surface(Protocol):
    """One conversation target on a platform, as the streamer sees it."""

    limit: int
    """Largest size of one message, in `measure` units."""

    def measure(self, text: str) -> int:
        """Size of `text` as the platform counts it against `limit`."""

    async def post(self, text: str, *, final: bool) -> str:
        """Post a new message; returns its id. `final` text is formatted by the surface
        (falling back to plain text if the platform rejects the markup); other text is
        sent plain."""

    async def edit(self, message_id: str, text: str, *, final: bool) -> None:
        """Replace the text of message `message_id` (`final` as for `post`)."""

    async def delete(self, message_id: str) -> None:
        """Delete message `message_id`."""


class EditBudget:
    """At most `max_calls` calls in any `window` seconds (a sliding window), e.g.
    Discord's 5 edits per 5 s per channel. Share one per platform channel.

    A call's slot is dated when its answer comes back (`landed`), not when it is sent:
    the platform counted the call at some moment in between, so a slot freed `window`
    after the answer can never let the platform see one call too many, whatever the
    network's jitter. (Dating it at sending, edits spaced exactly 5.000 s apart reached
    Discord as 6 in 5 s.) Until it lands, a call holds its slot."""

    def __init__(self, max_calls: int, window: float, clock: Clock) -> None:
        if max_calls < 1:
            raise ValueError("max_calls must be at least 1")
        self.max_calls = max_calls
        self.window = window
        self._clock = clock
        self._calls: list[float] = []  # when each counted call landed; inf: in flight
        self._landed = asyncio.Event()

    async def acquire(self) -> None:
        """Wait until one more call fits in the window, and count it (in flight)."""
        while True:
            now = self._clock.monotonic()
            # (A microsecond's slack: float sums must not keep a slot one ulp too long.)
            self._calls = [t for t in self._calls if t + self.window > now + 1e-6]
            if len(self._calls) < self.max_calls:
                self._calls.append(math.inf)
                return
            earliest = min(self._calls)
            if earliest == math.inf:  # every slot is in flight: wait for one to land
                self._landed.clear()
                await self._landed.wait()
            else:
                await self._clock.sleep(earliest + self.window - now)

    def landed(self) -> None:
        """The call counted by an `acquire` got its answer (or failed): date its slot."""
        if math.inf in self._calls:
            self._calls[self._calls.index(math.inf)] = self._clock.monotonic()
            self._landed.set()


def _pieces(surface: Surface, text: str) -> list[str]:
    """The messages `text` is posted as on `surface`, with no secret in them."""
    return split_message(scrub(text), surface.limit, surface.measure)


async def _call(
    op: Callable[[], Awaitable[T]], clock: Clock, budget: EditBudget | None, what: str
) -> T:
    """Run one platform call under `call_with_retry` (each try within `budget`); raises
    `DeliveryFailed` when the retries run out, `ChannelRefused` when the platform refused
    outright (whatever the surface raised)."""

    async def once() -> T:
        if budget is not None:
            await budget.acquire()
        try:
            return await op()
        except ChannelError:
            raise
        except Exception as exc:
            raise ChannelRefused(f"{what} refused: {type(exc).__name__}: {exc}") from exc
        finally:
            if budget is not None:
                budget.landed()

    try:
        return await call_with_retry(once, clock=clock, what=what)
    except (ChannelRateLimited, ChannelUnavailable) as exc:
        raise DeliveryFailed(f"{what} failed: {exc}") from exc


async def _post_final(surface: Surface, text: str, clock: Clock, budget: EditBudget | None) -> str:
    """Post finished text; if the platform refuses it, post it once more unformatted.
    Raises `DeliveryFailed` if that fails too."""
    try:
        return await _call(lambda: surface.post(text, final=True), clock, budget, "post")
    except ChannelRefused:
        log.warning("final post refused; posting it as plain text", exc_info=True)
    try:
        return await _call(lambda: surface.post(text, final=False), clock, budget, "plain post")
    except ChannelRefused as exc:
        raise DeliveryFailed(str(exc)) from exc


async def deliver(surface: Surface, text: str, *, clock: Clock | None = None) -> list[str]:
    """Post a complete message (split over several if long); returns the message ids.
    Silent or empty text posts nothing. Raises `DeliveryFailed` if the platform refused."""
    if is_silent(text):
        return []
    clock = clock or SystemClock()
    return [await _post_final(surface, piece, clock, None) for piece in _pieces(surface, text)]


class ReplyStreamer:
    """A `core.chat.ReplyStream` over a `Surface`.

    Text deltas grow the reply; a background task posts the first text, then edits at
    most every `min_interval` seconds (and within `budget`), skipping edits that change
    nothing; text past the surface's limit continues in a new message. `typing`, if
    given, is called after each intermediate post (posting clears the typing indicator
    on some platforms while the run goes on). `finish` makes the messages read exactly
    the final text.

    With `status_lines`, a tool step or a compaction shows as one line under the text
    (`channels.status`); with `status_alone` too, a run that starts with such a step
    posts the line as a message of its own at once, and that message becomes the
    answer when text comes (until then it shows the latest step).
    """

    def __init__(
        self,
        surface: Surface,
        *,
        clock: Clock | None = None,
        min_interval: float = 1.0,
        budget: EditBudget | None = None,
        typing: Callable[[], Awaitable[None]] | None = None,
        status_lines: bool = False,
        status_alone: bool = False,
        repost_over: int | None = None,
    ) -> None:
        self._surface = surface
        self._status_lines, self._status = status_lines, ""  # channels.status
        self._status_alone = status_lines and status_alone
        self._repost_over = repost_over  # a longer final answer is posted anew
        self._clock = clock or SystemClock()
        self._budget = budget
        self._typing = typing
        self._text = ""
        self._ids: list[str] = []
        self._shown: list[tuple[str, bool]] = []  # (text, final) last sent per message
        self._pacer = Pacer(self._flush, self._clock, min_interval, "reply stream")
        # Told each preview message's id as it is posted (the agent keeps them in the store,
        # so a preview left by a crash can be retracted after the restart).
        self.on_posted: Callable[[str], None] | None = None
        # Awaited once, before the first preview is posted (the agent commits the run's
        # start first, so that after a crash the run reads as interrupted, not as never
        # begun and answered again). `finish`'s caller commits before it on its own.
        self.before_preview: Callable[[], Awaitable[None]] | None = None

    async def retract(self, message_ids: list[str], note: str) -> None:
        """Edit previews a crashed run left behind to `note` (best effort: a message
        that cannot be edited any more is left as it is)."""
        for message_id in message_ids:
            edit = partial(self._surface.edit, message_id, note, final=True)
            try:
                await _call(edit, self._clock, self._budget, "retract")
            except ChannelError:
                log.info("could not retract the stale preview %s", message_id)

    @property
    def message_ids(self) -> list[str]:
        """Ids of the messages this reply currently occupies, in order."""
        return list(self._ids)

    @property
    def surface(self) -> Surface:
        return self._surface

    def adopt(self, message_id: str, shown: str) -> None:
        """Go on with an answer begun by other means (Slack's native stream, which failed):
        message `message_id` shows `shown`; later text edits it and continues below."""
        self._ids, self._shown = [message_id], [(shown, False)]

    def __call__(self, event: LoopEvent) -> None:
        if self._pacer.closed:
            return
        match event:
            case TextDelta(text=text):
                self._text += text
            case StreamRestarted(discard=True):
                self._text = ""
            case _:
                status = status_line(event) if self._status_lines else None
                if status is None or status == self._status:
                    return
                self._status = status
        self._pacer.wake()

    async def _flush(self) -> None:
        """Show the current text (plain) if it changed; failures are left to `finish`."""
        text = self._text
        if may_become_silent(text):
            if not (self._status_alone and self._status):
                # nothing to show, or a status alone where the typing indicator says as
                # much; a status message already up stays as it is (the latest step)
                return
            text = ""  # the step alone (never a silent marker's first letters)
        pieces = _pieces(self._surface, with_status(text, self._status))
        for i, piece in enumerate(pieces):
            final = i < len(pieces) - 1  # earlier messages are complete
            if i < len(self._ids):
                shown, was_final = self._shown[i]
                if was_final == final and shown.rstrip() == piece.rstrip():
                    continue
                edit = partial(self._surface.edit, self._ids[i], piece, final=final)
                if await self._once(edit, "edit") is None:
                    return
                self._shown[i] = (piece, final)
            else:
                await self._before_preview()
                posted = await self._once(partial(self._surface.post, piece, final=final), "post")
                if posted is None:
                    return
                self._ids.append(posted[0])
                self._shown.append((piece, final))
                if self.on_posted is not None:
                    self.on_posted(posted[0])
                await self._typing_again()
        for message_id in self._ids[len(pieces) :]:  # the text shrank (a discarded attempt)
            if await self._once(partial(self._surface.delete, message_id), "delete") is None:
                return  # still tracked: `finish` deletes it again, with retries
        del self._ids[len(pieces) :], self._shown[len(pieces) :]

    async def _once(self, op: Callable[[], Awaitable[T]], what: str) -> tuple[T] | None:
        """One intermediate call, not retried (a later edit or `finish` shows newer text);
        `(result,)`, or None if it failed."""
        if self._budget is not None:
            await self._budget.acquire()
        try:
            return (await op(),)
        except ChannelRateLimited as exc:
            log.info("stream %s rate limited; waiting %.1f s", what, exc.retry_after)
            await self._clock.sleep(max(exc.retry_after, 0.0))
            self._pacer.wake()  # show the latest text once the wait is over
            return None
        except Exception as exc:
            log.info("stream %s failed: %s: %s", what, type(exc).__name__, exc)
            return None
        finally:
            self._pacer.sent()
            if self._budget is not None:
                self._budget.landed()

    async def _before_preview(self) -> None:
        hook, self.before_preview = self.before_preview, None  # the first post pays, once
        await before_first(hook, "preview")

    async def _typing_again(self) -> None:
        if self._typing is None:
            return
        try:
            await self._typing()
        except Exception:
            log.debug("typing indicator failed", exc_info=True)

    async def finish(self, text: str) -> None:
        """Make the reply read exactly `split_message(text)`; silent or empty text posts
        nothing and deletes what was shown. Raises `DeliveryFailed` if the platform
        refused the final text."""
        try:
            await self._stop_background()
            if is_silent(text):
                await self._delete_from(0)
                return
            pieces = _pieces(self._surface, text)
            if self._repost_over is not None and self._ids and len(text) > self._repost_over:
                # A long answer comes as a new message (an edit does not mark the channel
                # unread); the previews go once it is there.
                previews, self._ids, self._shown = self._ids, [], []
                await self._finish_pieces(pieces)
                self._ids, kept = previews, self._ids
                await self._delete_from(0)
                self._ids, self._shown = kept, [(piece, True) for piece in pieces]
                return
            await self._finish_pieces(pieces)
        finally:
            await self.aclose()

    async def _finish_pieces(self, pieces: list[str]) -> None:
        kept = 0
        for i, piece in enumerate(pieces):
            if i < len(self._ids):
                if self._shown[i] == (piece, True):
                    kept = i + 1
                    continue
                if await self._edit_final(i, piece):
                    kept = i + 1
                    continue
                # The old message cannot be edited: post the rest anew, in order.
                await self._delete_from(i)
            self._ids.append(await _post_final(self._surface, piece, self._clock, self._budget))
            self._shown.append((piece, True))
            kept = len(self._ids)
        await self._delete_from(kept)

    async def _edit_final(self, index: int, piece: str) -> bool:
        """Edit message `index` to its final piece (formatted, else plain); False if the
        platform refused both. Transient failures that outlast retries raise."""
        await self._pacer.wait_turn()
        message_id = self._ids[index]
        for final in (True, False):
            try:
                edit = partial(self._surface.edit, message_id, piece, final=final)
                await _call(edit, self._clock, self._budget, "final edit")
            except ChannelRefused:
                log.warning("final edit refused (formatted=%s)", final, exc_info=True)
                continue
            finally:
                self._pacer.sent()
            self._shown[index] = (piece, True)
            return True
        return False

    async def _delete_from(self, index: int) -> None:
        """Delete messages `index…` (best effort: a stale extra message is not fatal)."""
        for message_id in self._ids[index:]:
            try:
                delete = partial(self._surface.delete, message_id)
                await _call(delete, self._clock, self._budget, "delete")
            except ChannelError:
                log.warning("could not delete message %s", message_id, exc_info=True)
        del self._ids[index:], self._shown[index:]

    async def _stop_background(self) -> None:
        """Stop the edit timer; a call already in flight is let finish."""
        await self._pacer.stop()

    async def aclose(self) -> None:
        """Stop background work (idempotent); what was shown stays as it is."""
        await self._pacer.aclose()


class Typing:
    """Shows a typing indicator: calls `send()` now and every `interval` seconds until
    the block ends (also on error or cancellation). Errors from `send` are ignored."""

    def __init__(
        self,
        send: Callable[[], Awaitable[None]],
        interval: float = 4.0,
        clock: Clock | None = None,
    ) -> None:
        self._send = send
        self._interval = interval
        self._clock = clock or SystemClock()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def __aenter__(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="typing")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    async def _run(self) -> None:
        while True:
            try:
                await self._send()
            except Exception:
                log.debug("typing indicator failed", exc_info=True)
            await self._clock.sleep(self._interval)
