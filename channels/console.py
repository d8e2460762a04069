"""The terminal channel: `parley chat` (interactive); the turn is drawn by
`channels.console_render.ConsoleRenderer`, which `parley chat -m` (`bot.cli`) uses too.

The answer goes to stdout; tool activity, reasoning and notices go to stderr, so
`parley chat -m "…" > answer.txt` captures only what the model says. The terminal is read
all the time, also while a turn runs, so `/stop` and the other commands act at once, as on
every channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Protocol, TextIO, runtime_checkable

from channels.console_render import ConsoleRenderer as ConsoleRenderer
from channels.console_render import one_line
from core.chat import (
    AgentPort,
    ApprovalRequest,
    ConversationKey,
    GrantScope,
    Inbound,
    is_silent,
)
from core.errors import ContextLimitExceeded, ProviderError, StoreError
from core.events import (
    LoopEvent,
)

if TYPE_CHECKING:
    from core.lease import Singleton  # the platforms' leases: `parley chat -m` takes none

log = logging.getLogger(__name__)

PROMPT = "you> "
HELP = (
    "Type a message. /stop or Ctrl-C stops the running turn; /help lists commands; "
    "/exit (or Ctrl-D) quits."
)


class LineReader:
    """Reads the terminal's lines on a daemon thread, so the event loop stays free for
    Ctrl-C and for a running turn. Bytes that are not UTF-8 become U+FFFD here.

    A line answers the question being asked (`ask`: an approval prompt) unless it is a
    /command; every other line waits for `readline`.
    """

    def __init__(self, fd: int | None = None) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._question: asyncio.Future[str | None] | None = None
        self._eof = False
        self._loop = asyncio.get_running_loop()
        self._fd = sys.stdin.fileno() if fd is None else fd
        threading.Thread(target=self._pump, name="stdin", daemon=True).start()

    def _pump(self) -> None:
        # os.read, not sys.stdin: a thread blocked in a buffered read holds its lock, and
        # the interpreter aborts at exit if it has to wait for that lock.
        pending = b""
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:  # the terminal went away
                chunk = b""
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                self._send(raw.decode("utf-8", "replace").rstrip("\r"))
        if pending:
            self._send(pending.decode("utf-8", "replace").rstrip("\r"))
        self._send(None)

    def _send(self, line: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while we read: exiting
            self._loop.call_soon_threadsafe(self._deliver, line)

    def _deliver(self, line: str | None) -> None:
        question = self._question
        answers = line is None or not line.lstrip().startswith("/")  # commands act as ever
        if question is not None and not question.done() and answers:
            question.set_result(line)
            if line is not None:
                return
        if line is None:
            self._eof = True
        self._queue.put_nowait(line)

    async def readline(self) -> str | None:
        """The next line typed (None at end of input)."""
        return await self._queue.get()

    async def ask(self, prompt: str, err: TextIO) -> str | None:
        """Write `prompt` and wait for the answer: the next line that is not a /command
        (None at end of input)."""
        if self._eof:
            return None
        question: asyncio.Future[str | None] = self._loop.create_future()
        self._question = question
        err.write(prompt)
        err.flush()
        try:
            return await question
        finally:
            if self._question is question:
                self._question = None


class ConsoleApprover:
    """Asks y/n in the terminal; no answer within the timeout (or no terminal) = denied."""

    def __init__(self, reader: LineReader | None, err: TextIO, timeout: float) -> None:
        self.reader, self.err, self.timeout = reader, err, timeout

    async def __call__(self, tool: str, summary: str, reason: str) -> bool:
        return (await self.answer(tool, summary, reason)) is not False

    async def answer(
        self, tool: str, summary: str, reason: str, *, grantable: bool = False
    ) -> bool | GrantScope:
        """False (no), True (yes), or where an "always" answer holds (`grantable` only)."""
        if self.reader is None:
            self.err.write(f"denied {tool}: {reason}; no one is at a terminal to approve it\n")
            return False
        choices = "[y/N/a=always here/c=always in this channel]" if grantable else "[y/N]"
        prompt = f"\n⚠ {reason}\n  {one_line(summary, 200)}\n  allow? {choices} "
        try:
            async with asyncio.timeout(self.timeout):
                answer = await self.reader.ask(prompt, self.err)
        except TimeoutError:
            self.err.write("\n  no answer: denied\n")
            return False
        said = (answer or "").strip().lower()
        if grantable and said in ("a", "always"):
            return "conversation"
        if grantable and said in ("c", "channel"):
            return "channel"
        return said in ("y", "yes")


def _report_failure(exc: BaseException, err: TextIO) -> None:
    if isinstance(exc, ContextLimitExceeded | ProviderError | StoreError):
        err.write(f"error: {exc}\n")
    else:
        err.write(f"error: {type(exc).__name__}: {exc}\n")
    err.flush()


CONSOLE_KEY = ("console", "local", "")


class ConsoleStream:
    """One streamed answer in the terminal (a `ReplyStream`)."""

    def __init__(self, renderer: ConsoleRenderer) -> None:
        self.renderer = renderer
        renderer.begin()

    def __call__(self, event: LoopEvent) -> None:
        self.renderer(event)

    async def finish(self, text: str) -> None:
        if is_silent(text):
            self.renderer.finish()
        else:
            self.renderer.complete(text)


class ConsoleResponder:
    """The terminal as a conversation (`Responder`): answers on stdout, the rest on stderr."""

    def __init__(self, renderer: ConsoleRenderer, approver: ConsoleApprover) -> None:
        self.renderer, self.approver = renderer, approver

    async def send(self, text: str) -> None:
        if not is_silent(text):
            self.renderer.message(text)

    def stream(self) -> ConsoleStream:
        return ConsoleStream(self.renderer)

    async def approve(self, request: ApprovalRequest) -> bool:
        answer = await self.approver.answer(
            request.tool, request.summary, request.reason, grantable=request.grantable
        )
        if isinstance(answer, str):  # "always": the terminal's user is the approver
            if request.record is not None:
                request.record.granted(answer, "console")
                request.record.answered(True, "console")
            return True
        if request.record is not None:
            request.record.answered(answer, "console")
        return answer

    @contextlib.asynccontextmanager
    async def typing(self) -> AsyncIterator[None]:
        yield


class ConversationLane(Protocol):
    """What the terminal reads of its conversation's lane in the agent: the tasks to wait
    for before it shows the prompt."""

    @property
    def worker(self) -> asyncio.Task[None] | None:
        """Takes the conversation's queued messages, one run after another."""

    @property
    def run_task(self) -> asyncio.Task[object] | None:
        """The run going on."""

    @property
    def idle(self) -> bool:
        """Nothing runs, waits or is being taken in."""


@runtime_checkable
class ConsoleAgent(AgentPort, Protocol):
    """The agent as the terminal needs it: what every channel needs (`AgentPort`, which
    also stops a run on Ctrl-C), plus a look at its own conversation's lane, so that the
    prompt shows only when the conversation is idle."""

    @property
    def lanes(self) -> Mapping[ConversationKey, ConversationLane]:
        """The conversations in memory (an idle one may be missing)."""

    async def settled(self, key: ConversationKey) -> None:
        """Until nothing taken in for the conversation `key` waits or runs (its messages
        wait in the store's queue, not in its lane)."""


async def _settled(agent: ConsoleAgent) -> None:
    """Until nothing runs or waits in the console's conversation."""
    await agent.settled(CONSOLE_KEY)


class _Prompt:
    """Shows `you> ` whenever the console's lane falls idle (never inside a streamed
    answer); input is read all the time regardless."""

    def __init__(self, agent: ConsoleAgent, renderer: ConsoleRenderer) -> None:
        self.agent, self.renderer = agent, renderer
        self._task: asyncio.Task[None] | None = None

    def when_idle(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._show(), name="console prompt")
            self._task.add_done_callback(_log_failure)

    async def _show(self) -> None:
        await _settled(self.agent)
        self.renderer.finish()
        self.renderer.err.write(PROMPT)
        self.renderer.err.flush()

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task})  # never raises: a cancel of our own goes on


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s failed", task.get_name(), exc_info=exc)


async def run_interactive(
    agent: ConsoleAgent,
    reader: LineReader,
    responder: ConsoleResponder,
    *,
    handle_sigint: bool = True,
) -> int:
    """`parley chat`: a REPL over the durable agent. Input is read while a turn runs:
    messages queue, commands (`/stop`, `/status`, …) act at once; Ctrl-C stops the running
    turn, not the program. `/exit` or Ctrl-D quits once the queued messages are answered."""
    loop = asyncio.get_running_loop()
    interrupts: set[asyncio.Task[None]] = set()

    async def interrupt() -> None:
        if not await agent.cancel_running(CONSOLE_KEY):
            sys.stderr.write(f"\n(type /exit or press Ctrl-D to quit)\n{PROMPT}")
            sys.stderr.flush()

    def on_sigint() -> None:  # a second Ctrl-C while the run ends cancels it again: force
        task = loop.create_task(interrupt(), name="console interrupt")
        interrupts.add(task)
        task.add_done_callback(interrupts.discard)
        task.add_done_callback(_log_failure)

    if handle_sigint:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    sys.stderr.write(HELP + "\n")
    prompt = _Prompt(agent, responder.renderer)
    try:
        prompt.when_idle()
        while (line := await reader.readline()) is not None:
            text = line.strip()
            if text in ("/exit", "/quit"):
                break
            if text:
                inbound = Inbound(
                    *CONSOLE_KEY, user_id="console", user_name="you", text=text, is_dm=True
                )
                try:
                    await agent.submit(inbound, responder)
                except StoreError as exc:  # not stored: say so, and keep the terminal
                    _report_failure(exc, sys.stderr)
            prompt.when_idle()
        await prompt.close()
        lane = agent.lanes.get(CONSOLE_KEY)
        if lane is not None and not lane.idle:
            sys.stderr.write("(finishing the running turn first; Ctrl-C stops it)\n")
        await _settled(agent)  # what was typed before /exit (or the end of a piped input)
        responder.renderer.finish()
    finally:
        await prompt.close()
        if handle_sigint:
            loop.remove_signal_handler(signal.SIGINT)
        for task in list(interrupts):  # each only waits for the run it stopped to end
            task.cancel()
        await asyncio.gather(*interrupts, return_exceptions=True)
    return 0


def terminal_responder(approval_timeout: float) -> ConsoleResponder:
    """This process's terminal as a conversation: answers stream to stdout, approvals are
    asked on stdin (its reader is `responder.approver.reader`)."""
    renderer = ConsoleRenderer(sys.stdout, sys.stderr, color=sys.stdout.isatty())
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
        assert isinstance(agent, ConsoleAgent), "the console needs its lane's state too"

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

    def singletons(self) -> list[Singleton]:
        """None: the terminal is this process's own."""
        return []
