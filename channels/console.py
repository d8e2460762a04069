"""The terminal channel: `parley chat` (interactive) and `parley chat -m` (one turn).

The answer streams to stdout; tool activity, reasoning and notices go to stderr, so
`parley chat -m "…" > answer.txt` captures only the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import AsyncIterator
from typing import TextIO

from core.agent import Agent
from core.chat import AgentPort, ApprovalRequest, ConversationKey, Inbound, is_silent
from core.conversation import Conversation
from core.errors import ContextLimitExceeded, ProviderError
from core.events import (
    LoopEvent,
    Notice,
    ReasoningDelta,
    StreamRestarted,
    TextDelta,
    ToolFinished,
    ToolStarted,
)

DIM, RESET = "\x1b[2m", "\x1b[0m"
HELP = (
    "Type a message. Ctrl-C stops the running turn; /help lists commands; /exit (or Ctrl-D) quits."
)


def _one_line(text: str, width: int = 100) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


class ConsoleRenderer:
    """An event sink that draws a turn in the terminal."""

    def __init__(self, out: TextIO, err: TextIO, *, stream_text: bool, color: bool) -> None:
        self.out, self.err = out, err
        self.stream_text = stream_text
        self.color = color
        self.at_line_start = True

    def _dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.color else text

    def _err_line(self, text: str) -> None:
        if not self.at_line_start:
            self.out.write("\n")
            self.out.flush()
            self.at_line_start = True
        self.err.write(text + "\n")
        self.err.flush()

    def __call__(self, event: LoopEvent) -> None:
        match event:
            case TextDelta(text=text) if self.stream_text:
                self.out.write(text)
                self.out.flush()
                self.at_line_start = text.endswith("\n")
            case ReasoningDelta(text=text) if self.stream_text:
                self.err.write(self._dim(text))
                self.err.flush()
            case ToolStarted(call=call, category=category):
                tag = "" if category == "read" else f" [{category}]"
                self._err_line(self._dim(f"→ {call.name}{tag} {_one_line(call.arguments, 80)}"))
            case ToolFinished(call=call, result=result, duration=duration):
                mark = "✗" if result.is_error else "✓"
                summary = _one_line(result.content, 90) or "(no output)"
                self._err_line(self._dim(f"  {mark} {call.name} {duration:.1f}s: {summary}"))
            case StreamRestarted(attempt=attempt, reason=reason, delay=delay, discard=discard):
                note = (
                    "; discarding the partial answer above" if discard and self.stream_text else ""
                )
                self._err_line(f"⟳ retry {attempt} in {delay:.1f}s ({_one_line(reason, 80)}){note}")
            case Notice(text=text):
                self._err_line(text)
            case _:
                pass

    def finish(self) -> None:
        if not self.at_line_start:
            self.out.write("\n")
            self.out.flush()
            self.at_line_start = True


class LineReader:
    """Reads stdin lines on a daemon thread, so the event loop stays free for Ctrl-C."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, name="stdin", daemon=True).start()

    def _pump(self) -> None:
        for line in sys.stdin:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, line.rstrip("\n"))
        self._loop.call_soon_threadsafe(self._queue.put_nowait, None)

    async def readline(self, prompt: str, err: TextIO) -> str | None:
        err.write(prompt)
        err.flush()
        return await self._queue.get()


class ConsoleApprover:
    """Asks y/n in the terminal; no answer within the timeout (or no terminal) = denied."""

    def __init__(self, reader: LineReader | None, err: TextIO, timeout: float) -> None:
        self.reader, self.err, self.timeout = reader, err, timeout

    async def __call__(self, tool: str, summary: str, reason: str) -> bool:
        if self.reader is None:
            self.err.write(f"denied {tool}: {reason}; no one is at a terminal to approve it\n")
            return False
        prompt = f"\n⚠ {reason}\n  {_one_line(summary, 200)}\n  allow? [y/N] "
        try:
            async with asyncio.timeout(self.timeout):
                answer = await self.reader.readline(prompt, self.err)
        except TimeoutError:
            self.err.write("\n  no answer: denied\n")
            return False
        return (answer or "").strip().lower() in ("y", "yes")


def _report_failure(exc: BaseException, err: TextIO) -> None:
    if isinstance(exc, ContextLimitExceeded | ProviderError):
        err.write(f"error: {exc}\n")
    else:
        err.write(f"error: {type(exc).__name__}: {exc}\n")
    err.flush()


async def run_one_shot(conversation: Conversation, message: str) -> int:
    """`parley chat -m`: one turn; only the final answer goes to stdout."""
    renderer = ConsoleRenderer(sys.stdout, sys.stderr, stream_text=False, color=False)
    try:
        outcome = await conversation.turn(message, renderer)
    except (ProviderError, ContextLimitExceeded) as exc:
        _report_failure(exc, sys.stderr)
        return 1
    sys.stdout.write(outcome.text.rstrip("\n") + "\n")
    sys.stdout.flush()
    return 0 if outcome.reason == "final" else 1


CONSOLE_KEY = ("console", "local", "")


class ConsoleStream:
    """One streamed answer in the terminal (a `ReplyStream`)."""

    def __init__(self, renderer: ConsoleRenderer) -> None:
        self.renderer = renderer
        self.streamed = ""

    def __call__(self, event: LoopEvent) -> None:
        if isinstance(event, TextDelta):
            self.streamed += event.text
        elif isinstance(event, StreamRestarted) and event.discard:
            self.streamed = ""
        self.renderer(event)

    async def finish(self, text: str) -> None:
        if is_silent(text):
            self.renderer.finish()
            return
        if not self.streamed.strip() or text.strip() != self.streamed.strip():
            # The answer was not (all) streamed: a stop notice, an error, a summary.
            self.renderer.finish()
            self.renderer.out.write(text.rstrip("\n") + "\n")
            self.renderer.out.flush()
            self.renderer.at_line_start = True
        self.renderer.finish()


class ConsoleResponder:
    """The terminal as a conversation (`Responder`): answers on stdout, the rest on stderr."""

    def __init__(self, renderer: ConsoleRenderer, approver: ConsoleApprover) -> None:
        self.renderer, self.approver = renderer, approver

    async def send(self, text: str) -> None:
        if not is_silent(text):
            self.renderer.finish()
            self.renderer.out.write(text.rstrip("\n") + "\n")
            self.renderer.out.flush()

    def stream(self) -> ConsoleStream:
        return ConsoleStream(self.renderer)

    async def approve(self, request: ApprovalRequest) -> bool:
        return await self.approver(request.tool, request.summary, request.reason)

    @contextlib.asynccontextmanager
    async def typing(self) -> AsyncIterator[None]:
        yield


async def run_interactive(
    agent: Agent, reader: LineReader, responder: ConsoleResponder, *, handle_sigint: bool = True
) -> int:
    """`parley chat`: a REPL over the durable agent. Ctrl-C stops the running turn, not the
    program; every command (`/status`, `/resume`, …) works as typed."""
    loop = asyncio.get_running_loop()
    lane = await agent.lane(CONSOLE_KEY)

    def on_sigint() -> None:
        if lane.run_task is not None and not lane.run_task.done():
            lane.run_task.cancel()  # a second Ctrl-C cancels again: force
        else:
            sys.stderr.write("\n(type /exit or press Ctrl-D to quit)\nyou> ")
            sys.stderr.flush()

    if handle_sigint:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        await agent.reconcile()  # `parley run` reconciles once for every channel
    sys.stderr.write(HELP + "\n")
    try:
        while (line := await reader.readline("you> ", sys.stderr)) is not None:
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                break
            await agent.submit(
                Inbound(*CONSOLE_KEY, user_id="console", user_name="you", text=text, is_dm=True),
                responder,
            )
            await agent.wait_idle()
            responder.renderer.finish()
    finally:
        if handle_sigint:
            loop.remove_signal_handler(signal.SIGINT)
    return 0


def terminal_responder(approval_timeout: float) -> ConsoleResponder:
    """This process's terminal as a conversation: answers stream to stdout, approvals are
    asked on stdin (its reader is `responder.approver.reader`)."""
    renderer = ConsoleRenderer(sys.stdout, sys.stderr, stream_text=True, color=sys.stdout.isatty())
    return ConsoleResponder(renderer, ConsoleApprover(LineReader(), sys.stderr, approval_timeout))


class ConsoleChannel:
    """The terminal as a channel of `parley run --console` (a `Channel`)."""

    name = "console"

    def __init__(self, approval_timeout: float) -> None:
        self.approval_timeout = approval_timeout
        self.closed = asyncio.Event()
        self._responder: ConsoleResponder | None = None
        self._task: asyncio.Task[int] | None = None

    def _ensure_responder(self) -> ConsoleResponder:
        if self._responder is None:
            self._responder = terminal_responder(self.approval_timeout)
        return self._responder

    async def start(self, agent: AgentPort) -> None:
        responder = self._ensure_responder()
        reader = responder.approver.reader
        assert reader is not None
        assert isinstance(agent, Agent)

        async def repl() -> int:
            try:
                return await run_interactive(agent, reader, responder, handle_sigint=False)
            finally:
                self.closed.set()

        self._task = asyncio.create_task(repl(), name="console")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def responder(self, key: ConversationKey) -> ConsoleResponder:
        return self._ensure_responder()

    def access(self) -> str:
        return "whoever types at this terminal"
