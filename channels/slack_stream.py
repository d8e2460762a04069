"""Slack's native text streaming for one answer (docs/channels.md#slack-native-streaming).

`chat.startStream` opens the answer as a streaming message in the thread, `appendStream`
adds what the model wrote since (and each tool step as a task chunk, timeline mode), and
`stopStream` finishes it with the rest. Slack renders the Markdown itself.

Edits stay the fallback, on the same answer: when the workspace or the token cannot stream
(`missing_scope`, an unknown method: remembered for the channel), when a stream is refused
or expires (`message_not_in_streaming_state`), when `stopStream` is refused (Slack
Connect's `user_not_found`), when a retried model call takes back text already streamed, or
when the answer outgrows one message. The edit streamer then adopts the streamed message
(stopped first, best effort) and edits it to the answer, splitting as usual; if Slack will
not let it be edited, it is deleted and the answer posted anew. So nothing shown is lost and
nothing is posted twice.

Text is scrubbed of secrets as a whole before anything is sent; only what extends what
was already sent is appended (anything else falls back to edits, which can rewrite).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from slack_sdk.web.async_client import AsyncWebClient

from channels.pacing import Pacer, before_first
from channels.retry import call_with_retry
from channels.slack_api import slack_call
from channels.slack_status import THINKING, ThreadStatus, running
from channels.stream import ReplyStreamer
from core.chat import is_silent, may_become_silent
from core.clock import Clock
from core.errors import ChannelError, ChannelRateLimited, ChannelRefused, DeliveryFailed
from core.events import (
    CompactionProgress,
    LLMCallStarted,
    LoopEvent,
    Notice,
    StreamRestarted,
    TextDelta,
    ToolFinished,
    ToolStarted,
)
from core.records import record
from core.secrets import scrub

log = logging.getLogger(__name__)

T = TypeVar("T")

NATIVE_LIMIT = 11_000  # characters of one streamed message (markdown_text takes 12,000)
UNSUPPORTED = frozenset(
    {"missing_scope", "not_allowed_token_type", "unknown_method", "feature_not_enabled"}
)
"""`chat.startStream` refusals that mean this workspace or token cannot stream at all."""
OUTPUT_CHARS = 200  # of a tool's result shown in its task chunk


@record(frozen=True, slots=True)
class StreamTarget:
    """Where a native stream goes: a thread, and in a channel who reads it as it streams."""

    client: AsyncWebClient
    channel_id: str
    thread_ts: str
    recipient_user_id: str | None = None
    recipient_team_id: str | None = None


class NativeStream:
    """A `core.chat.PreviewStream` over Slack's streaming methods, with `fallback` (the
    edit streamer of the same thread) taking over when streaming cannot go on."""

    def __init__(
        self,
        target: StreamTarget,
        fallback: ReplyStreamer,
        *,
        clock: Clock,
        min_interval: float,
        status: ThreadStatus | None = None,
        unsupported: Callable[[], None] | None = None,
        native: bool = True,
    ) -> None:
        self._target, self._fallback = target, fallback
        self._clock = clock
        self._status, self._unsupported = status, unsupported
        self._text = ""  # the answer so far, as the model wrote it
        self._sent = ""  # what of it (scrubbed) the stream shows
        self._segment = 0  # where the text of the current model call starts in `_text`
        self._chunks: list[dict[str, Any]] = []  # task chunks not sent yet
        self._ts: str | None = None
        self._native = native  # False: edits from the start (statuses still show)
        self._pacer = Pacer(
            self._flush, clock, min_interval, "slack stream", going=lambda: self._native
        )
        self.on_posted: Callable[[str], None] | None = None
        self.before_preview: Callable[[], Awaitable[None]] | None = None

    # ---- PreviewStream ----------------------------------------------------------------------

    @property
    def message_ids(self) -> list[str]:
        if not self._native:
            return self._fallback.message_ids
        return [self._ts] if self._ts else []

    async def retract(self, message_ids: list[str], note: str) -> None:
        """A stream a crash interrupted is still open on Slack: stop it, then edit it."""
        for message_id in message_ids:
            await self._stop_quietly(message_id)
        await self._fallback.retract(message_ids, note)

    async def aclose(self) -> None:
        await self._pacer.aclose()
        await self._fallback.aclose()
        if self._status is not None:
            await self._status.close()

    def __call__(self, event: LoopEvent) -> None:
        if self._pacer.closed:
            return
        self._show_status(event)
        if not self._native:
            self._fallback(event)
            return
        match event:
            case TextDelta(text=text):
                self._text += text
            case StreamRestarted(discard=True):
                self._text = self._text[: self._segment]
            case LLMCallStarted():
                self._segment = len(self._text)
                return
            case ToolStarted(call=call):
                self._chunks.append(_task(call.id, call.name, "in_progress"))
            case ToolFinished(call=call, result=result):
                output = " ".join(result.content.split())[:OUTPUT_CHARS]
                status = "error" if result.is_error else "complete"
                self._chunks.append(_task(call.id, call.name, status, output or None))
            case _:
                return
        self._pacer.wake()

    def _show_status(self, event: LoopEvent) -> None:
        status = self._status
        if status is None:
            return
        match event:
            case ToolStarted(call=call):
                status.show(running(call.name))
            case ToolFinished() | LLMCallStarted():
                status.show(THINKING)
            case CompactionProgress() as progress:
                status.show(progress.line)
            case Notice(text=text, level="warning"):  # e.g. no LLM provider: waiting
                status.show(text)
            case TextDelta(text=text) if text.strip():
                status.show("")  # the text itself shows that it is answering
            case _:
                pass

    async def finish(self, text: str) -> None:
        try:
            await self._pacer.stop()  # a call in flight lands first
            if self._native and self._ts is not None:
                if await self._finish_native(text):
                    return
                await self._fall_back("the final text cannot end the stream")
            await self._fallback.finish(text)
        finally:
            if self._status is not None:
                await self._status.clear()
            await self.aclose()

    # ---- streaming --------------------------------------------------------------------------

    async def _flush(self) -> None:
        text = scrub(self._text)
        if self._ts is not None and not text.startswith(self._sent):
            await self._fall_back("the text streamed so far was taken back")
            return
        if len(text) > NATIVE_LIMIT:
            await self._fall_back("the answer outgrows one streamed message")
            return
        quiet = may_become_silent(text)
        if quiet and not self._chunks:
            return
        piece = "" if quiet else text[len(self._sent) :]
        chunks, self._chunks = self._chunks, []
        try:
            if self._ts is None:
                await self._start(piece, chunks)
            elif piece or chunks:
                await self._append(piece, chunks)
        except ChannelRateLimited as exc:
            self._chunks[:0] = chunks  # sent with the next call
            await self._clock.sleep(max(exc.retry_after, 0.0))
            self._pacer.wake()
            return
        except ChannelError as exc:
            self._chunks[:0] = chunks
            refused = isinstance(exc, ChannelRefused) and exc.code in UNSUPPORTED
            if refused and self._ts is None and self._unsupported is not None:
                self._unsupported()  # remembered: later answers do not try again
            await self._fall_back(f"{type(exc).__name__}: {exc}")
            return
        finally:
            self._pacer.sent()
        if not quiet:
            self._sent = text

    def _body(self, piece: str, chunks: list[dict[str, Any]]) -> dict[str, Any]:
        if not chunks:
            return {"markdown_text": piece}
        if piece:  # text and tasks in the order they happened: the tasks came after it
            chunks = [{"type": "markdown_text", "text": piece}, *chunks]
        return {"chunks": chunks}

    async def _start(self, piece: str, chunks: list[dict[str, Any]]) -> None:
        hook, self.before_preview = self.before_preview, None
        await before_first(hook, "stream")
        t = self._target
        response = await slack_call(
            t.client.chat_startStream(
                channel=t.channel_id,
                thread_ts=t.thread_ts,
                recipient_user_id=t.recipient_user_id,
                recipient_team_id=t.recipient_team_id,
                task_display_mode="timeline",
                **self._body(piece, chunks),
            )
        )
        self._ts = str(response["ts"])
        if self.on_posted is not None:
            self.on_posted(self._ts)

    async def _append(self, piece: str, chunks: list[dict[str, Any]]) -> None:
        t, ts = self._target, self._ts
        assert ts is not None
        await slack_call(
            t.client.chat_appendStream(channel=t.channel_id, ts=ts, **self._body(piece, chunks))
        )

    async def _finish_native(self, text: str) -> bool:
        """End the stream with the rest of `text`; False if the edit fallback must finish."""
        t, ts = self._target, self._ts
        assert ts is not None
        if is_silent(text):
            await self._stop_quietly(ts)
            return False  # the fallback (which adopts the message) deletes it
        # The answer is the last model call's text; the stream also shows the words that
        # came before the tool steps (a timeline), which stay.
        final = next(
            (
                full
                for full in (scrub(self._text[: self._segment] + text), scrub(text))
                if full.startswith(self._sent)
            ),
            None,
        )
        if final is None or len(final) > NATIVE_LIMIT:
            return False
        rest, chunks = final[len(self._sent) :], self._chunks
        body = self._body(rest, chunks) if rest or chunks else {}
        try:
            await call_with_retry(
                lambda: slack_call(t.client.chat_stopStream(channel=t.channel_id, ts=ts, **body)),
                clock=self._clock,
                what="slack chat.stopStream",
            )
        except ChannelRefused as exc:  # expired, or Slack Connect's user_not_found
            log.info("slack: stopping the stream was refused (%s); editing instead", exc.code)
            return False
        except ChannelError as exc:
            raise DeliveryFailed(f"slack chat.stopStream failed: {exc}") from exc
        self._sent, self._chunks = final, []
        return True

    async def _fall_back(self, why: str) -> None:
        """Edits take over the answer from here: the streamed message is theirs to edit."""
        log.info("slack: native streaming gives way to edits (%s)", why)
        self._native = False
        fallback = self._fallback
        fallback.on_posted = self.on_posted
        fallback.before_preview = self.before_preview
        if self._ts is not None:
            await self._stop_quietly(self._ts)
            fallback.adopt(self._ts, self._sent)
        if self._text:
            fallback(TextDelta(self._text))

    async def _stop_quietly(self, ts: str) -> None:
        t = self._target
        try:
            await slack_call(t.client.chat_stopStream(channel=t.channel_id, ts=ts))
        except ChannelError as exc:
            log.debug("slack: stopping stream %s: %s", ts, exc)


def _task(call_id: str, tool: str, status: str, output: str | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "type": "task_update",
        "id": call_id or tool,
        "title": f"`{tool}`",
        "status": status,
    }
    if output:
        chunk["output"] = output
    return chunk
