"""The terminal as a channel, run as a user runs it (a real `parley chat` / `parley run`
subprocess against the fake LLM): input is read while a turn runs, so `/stop` ends it in
every phase; bytes that are not UTF-8 are made valid before anything stores them."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec
from tests.helpers import pids_running, wait_dead
from tests.process import REPO, child_env, start_parley, write_config

STOP_WITHIN = 2.0  # seconds from typing /stop to the "Stopped." line


class Terminal:
    """A running `parley` whose stdout and stderr are collected as they arrive."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        self.proc, self.stdin = proc, proc.stdin
        self.out, self.err = bytearray(), bytearray()
        self._changed = asyncio.Event()
        self._readers = [
            asyncio.create_task(self._collect(proc.stdout, self.out)),
            asyncio.create_task(self._collect(proc.stderr, self.err)),
        ]

    async def _collect(self, stream: asyncio.StreamReader, into: bytearray) -> None:
        while chunk := await stream.read(4096):
            into.extend(chunk)
            self._changed.set()

    async def type(self, *lines: bytes) -> None:
        self.stdin.write(b"".join(line + b"\n" for line in lines))
        await self.stdin.drain()

    async def until(self, condition: Callable[[], bool], what: str, timeout: float = 15) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not condition():
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):  # also re-check files now and then
                        await asyncio.wait_for(self._changed.wait(), 0.05)
        except TimeoutError:
            raise AssertionError(
                f"no {what} within {timeout:g} s\nstdout: {bytes(self.out)!r}\n"
                f"stderr: {bytes(self.err)!r}"
            ) from None

    async def exit(self, *typed: bytes) -> int:
        """Type `typed` (then /exit) and wait for the process to end."""
        await self.type(*typed, b"/exit")
        self.stdin.close()
        code = await asyncio.wait_for(self.proc.wait(), 30)
        await asyncio.gather(*self._readers)
        return code


@asynccontextmanager
async def terminal(fake_llm: FakeLLM, tmp_path: Path, *args: str) -> AsyncIterator[Terminal]:
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    proc = await start_parley("--config", str(config), *args, env=env)
    term = Terminal(proc)
    try:
        await term.until(lambda: b"you> " in term.err or b"parley: ready" in term.err, "prompt")
        yield term
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for reader in term._readers:
            reader.cancel()


def hang_until(gate: asyncio.Event, reply: Reply) -> Callable[[RecordedRequest], Awaitable[Reply]]:
    """A fake-LLM responder that keeps the request waiting until `gate` is set."""

    async def respond(request: RecordedRequest) -> Reply:
        await gate.wait()
        return reply

    return respond


async def stop_within_deadline(term: Terminal) -> None:
    await term.type(b"/stop")
    await term.until(lambda: b"Stopped." in term.out, "Stopped.", timeout=STOP_WITHIN)


# ---- /stop reaches the running turn ------------------------------------------------------


async def test_stop_while_the_answer_streams(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="word " * 400, chunk_size=4, chunk_delay=0.02), Reply(text="next"))
    async with terminal(fake_llm, tmp_path, "chat") as term:
        await term.type(b"tell me a long story")
        await term.until(lambda: term.out.startswith(b"word"), "streamed text")
        await stop_within_deadline(term)
        await fake_llm.wait_for_disconnects(1)
        code = await term.exit(b"and now?")
    assert code == 0, bytes(term.err)
    assert term.out.count(b"word") < 400
    assert b"next" in term.out
    users = [m["content"] for m in fake_llm.requests[1].json["messages"] if m["role"] == "user"]
    assert users == ["tell me a long story", "and now?"]  # a valid history after the stop


async def test_stop_while_waiting_for_the_model(fake_llm: FakeLLM, tmp_path: Path) -> None:
    gate = asyncio.Event()
    fake_llm.responder = hang_until(gate, Reply(text="too late"))
    try:
        async with terminal(fake_llm, tmp_path, "chat") as term:
            await term.type(b"hello?")
            await fake_llm.wait_for_requests(1, timeout=15)
            await stop_within_deadline(term)
            code = await term.exit()
    finally:
        gate.set()
    assert code == 0, bytes(term.err)
    assert b"too late" not in term.out


async def test_stop_inside_a_long_bash_call(fake_llm: FakeLLM, tmp_path: Path) -> None:
    # Found by its command line: inside the call's PID namespace `$$` is not the host's pid.
    command = "exec sleep 60.103"
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("bash", {"command": command})]))
    async with terminal(fake_llm, tmp_path, "chat") as term:
        await term.type(b"wait a minute")
        await term.until(lambda: bool(pids_running("sleep", "60.103")), "the sleeper")
        sleepers = pids_running("sleep", "60.103")
        await stop_within_deadline(term)
        assert wait_dead(sleepers) == []
        code = await term.exit()
    assert code == 0, bytes(term.err)
    assert len(fake_llm.requests) == 1  # the model was not asked to go on


async def test_stop_between_tools_while_the_next_call_waits(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gate = asyncio.Event()
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("bash", {"command": "echo one"})]))
    fake_llm.responder = hang_until(gate, Reply(text="too late"))
    try:
        async with terminal(fake_llm, tmp_path, "chat") as term:
            await term.type(b"one step")
            await fake_llm.wait_for_requests(2, timeout=15)  # the tool ran; the model is asked
            assert b"bash" in term.err
            await stop_within_deadline(term)
            code = await term.exit()
    finally:
        gate.set()
    assert code == 0, bytes(term.err)


async def test_stop_at_an_approval_prompt(fake_llm: FakeLLM, tmp_path: Path) -> None:
    junk = tmp_path / "ws" / "junk"
    junk.mkdir(parents=True)
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "echo one"})]),
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]),
    )
    async with terminal(fake_llm, tmp_path, "chat") as term:
        await term.type(b"clean up")
        await term.until(lambda: b"allow? [y/N]" in term.err, "approval prompt")
        await stop_within_deadline(term)
        code = await term.exit()
    assert code == 0, bytes(term.err)
    assert junk.exists()  # a /stop is no "yes"


async def test_commands_act_at_an_approval_prompt_and_y_still_answers_it(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = tmp_path / "ws" / "junk"
    junk.mkdir(parents=True)
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]),
        Reply(text="Removed."),
    )
    async with terminal(fake_llm, tmp_path, "chat") as term:
        await term.type(b"clean up")
        await term.until(lambda: b"allow? [y/N]" in term.err, "approval prompt")
        await term.type(b"/status")  # a command is no answer: it acts at once
        await term.until(lambda: b"Run: running" in term.out, "status")
        await term.type(b"y")
        await term.until(lambda: b"Removed." in term.out, "answer")
        code = await term.exit()
    assert code == 0, bytes(term.err)
    assert not junk.exists()


async def test_stop_in_parley_run_console(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="word " * 400, chunk_size=4, chunk_delay=0.02))
    async with terminal(fake_llm, tmp_path, "run", "--console") as term:
        await term.until(lambda: b"parley: ready" in term.err, "ready")
        await term.type(b"tell me a long story")
        await term.until(lambda: term.out.startswith(b"word"), "streamed text")
        await stop_within_deadline(term)
        code = await term.exit()
    assert code == 0, bytes(term.err)
    assert b"parley: stopped" in term.err


async def test_typed_ahead_messages_queue_and_commands_do_not(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(text="first answer " * 20, chunk_size=4, chunk_delay=0.01),
        Reply(text="second answer"),
    )
    async with terminal(fake_llm, tmp_path, "chat") as term:
        # All typed at once: /status answers during the first turn, "two" waits for it,
        # and /exit quits once both are answered.
        code = await term.exit(b"one", b"/status", b"two")
    assert code == 0, bytes(term.err)
    out = term.out.decode()
    # "one" is running, or still a queued run the dispatcher is about to claim
    status = re.search(r"Run: (running|idle, 1 queued)", out)
    assert status is not None, out
    assert status.start() < out.index("first answer") < out.index("second answer")
    assert out.endswith("first answer \nsecond answer\n")


# ---- text that is not valid Unicode --------------------------------------------------------


async def test_invalid_utf8_on_stdin_is_answered_and_stored(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="got it"))
    async with terminal(fake_llm, tmp_path, "chat") as term:
        code = await term.exit(b"caf\xc3\xa9 \xff\xfe ok")
    assert code == 0, bytes(term.err)
    assert b"Traceback" not in term.err
    assert term.out == b"got it\n"
    users = [m["content"] for m in fake_llm.requests[0].json["messages"] if m["role"] == "user"]
    assert users == ["café \ufffd\ufffd ok"]
    with sqlite3.connect(tmp_path / "parley.db") as db:
        states = [row[0] for row in db.execute("SELECT state FROM runs")]
    assert states == ["completed"]


@pytest.mark.parametrize("argument", [b"caf\xc3\xa9 \xff\xfe ok", b"caf\xc3\xa9 \xed\xa0\x80 ok"])
async def test_invalid_utf8_in_chat_m_is_answered(
    fake_llm: FakeLLM, tmp_path: Path, argument: bytes
) -> None:
    fake_llm.script(Reply(text="got it"))
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "--config", str(config), "chat", "-m", argument,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, out) == (0, b"got it\n"), err
    [user] = [m["content"] for m in fake_llm.requests[0].json["messages"] if m["role"] == "user"]
    assert user.startswith("café \ufffd")
    assert user.endswith("\ufffd ok")


async def test_a_message_the_store_refused_is_reported_and_the_terminal_goes_on(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="stored this time"))
    async with terminal(fake_llm, tmp_path, "chat") as term:
        db = sqlite3.connect(tmp_path / "parley.db", isolation_level=None, timeout=10)
        try:
            db.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the busy timeout
            await term.type(b"first try")
            await term.until(
                lambda: b"error:" in term.err or term.proc.returncode is not None,
                "the store's refusal",
                timeout=30,
            )
            assert term.proc.returncode is None, bytes(term.err)
        finally:
            db.close()
        code = await term.exit(b"second try")
    assert code == 0, bytes(term.err)
    assert b"database is locked" in term.err
    assert b"Traceback" not in term.err
    assert term.out == b"stored this time\n"


def test_compaction_progress_is_a_stderr_line_and_stdout_keeps_only_the_answer() -> None:
    import io

    from channels.console import ConsoleRenderer
    from core.events import CompactionProgress, StreamRestarted, TextDelta

    out, err = io.StringIO(), io.StringIO()
    renderer = ConsoleRenderer(out, err, color=False)
    renderer(CompactionProgress("R1", 120_000))  # started: nothing to show on a terminal
    renderer(CompactionProgress("R1", 120_000, 40_000))
    renderer(TextDelta("Hello wo"))
    renderer(StreamRestarted(1, "cut", 0.5, discard=True))
    renderer(TextDelta("Hello world."))
    renderer.finish()
    assert out.getvalue() == "Hello world.\n"
    assert "Compacting: 120k → 40k tokens\n" in err.getvalue()
    assert err.getvalue().count("Compacting") == 1
