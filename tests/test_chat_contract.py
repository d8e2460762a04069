"""The channel-agent contract (core/chat.py): a message is read for a command once, when it
is built; the reply streams that edit their previews are told apart from those that do not."""

from __future__ import annotations

import io
from dataclasses import replace

from channels.console import ConsoleRenderer, ConsoleStream
from channels.stream import ReplyStreamer
from core.agent.responders import QuietResponder
from core.chat import Inbound, previews
from tests.fakes.clock import FakeClock


class Chat:
    """A surface nothing is posted to here (the streamer is only built)."""

    limit = 4096

    def measure(self, text: str) -> int:
        return len(text)

    async def post(self, text: str, *, final: bool) -> str:
        raise AssertionError("nothing is streamed in these tests")

    async def edit(self, message_id: str, text: str, *, final: bool) -> None:
        raise AssertionError("nothing is streamed in these tests")

    async def delete(self, message_id: str) -> None:
        raise AssertionError("nothing is streamed in these tests")


def message(text: str) -> Inbound:
    return Inbound("telegram", "42", "", "7", "alice", text)


def test_the_command_is_read_when_the_message_is_built() -> None:
    assert message("/status@parley_bot").command == ("status", "")
    assert message("  /GOAL create ship it --auto ").command == ("goal", "create ship it --auto")
    assert message("/roll 2d6").command is None  # not one of ours
    assert message("status please").command is None


def test_a_changed_text_is_read_again() -> None:
    # Slack rewrites the text of a message it took in (names resolved): the command follows.
    first = message("hello")
    assert replace(first, text="/stop").command == ("stop", "")
    assert replace(message("/stop"), text="stop").command is None
    assert first == message("hello")  # the parse is no part of a message's identity


def test_previews_tells_the_chat_streamer_from_streams_that_post_nothing_to_edit() -> None:
    streamer = ReplyStreamer(Chat(), clock=FakeClock())
    console = ConsoleStream(ConsoleRenderer(io.StringIO(), io.StringIO(), color=False))
    assert previews(streamer)
    assert previews(ReplyStreamer(Chat(), clock=FakeClock()))  # the class's verdict, kept
    assert not previews(console)
    assert not previews(QuietResponder())
