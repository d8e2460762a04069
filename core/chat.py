"""What the agent and the chat channels say to each other (docs/channels.md), platform-free.

A channel turns platform events into `Inbound` and hands them to the agent with a
`Responder` for that conversation; the agent answers through the responder: a streamed
reply per run, plain posts (command replies, notices, cron reports) and approval prompts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import field, fields, replace
from typing import Literal, Protocol, TypeGuard, runtime_checkable

from core.command_table import parse_command
from core.events import LoopEvent
from core.records import record

ConversationKey = tuple[str, str, str]
"""(channel type, channel id, thread id or "")."""

SILENT_REPLIES = ("[SILENT]", "NO_REPLY")


def valid_text(text: str) -> str:
    """`text` as valid Unicode: a surrogate pair is joined into its character and a lone
    surrogate (JSON's `"\\ud800"`, a byte Python could not decode) becomes U+FFFD.

    SQLite, JSON encoders and the platforms refuse lone surrogates, so text from outside
    (platform events, the terminal) passes through here before anything stores or sends it.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def is_silent(text: str) -> bool:
    """An empty reply, or one the model marked as not to be posted."""
    stripped = text.strip()
    return not stripped or stripped in SILENT_REPLIES


def may_become_silent(text: str) -> bool:
    """While an answer streams: the text so far could still turn out `is_silent`."""
    stripped = text.strip()
    return not stripped or any(marker.startswith(stripped) for marker in SILENT_REPLIES)


@record(frozen=True, slots=True)
class Inbound:
    """One message from a platform, normalised. `text` is untrusted user data.

    Every field is made valid Unicode when the message is built (see `valid_text`), so no
    platform's odd bytes can break a store commit or a request later on. The text is
    read for a command then too, once: `command` is what the channel and the agent act on.
    """

    channel: str
    channel_id: str
    thread_id: str
    user_id: str
    user_name: str
    text: str
    is_dm: bool = False
    mentions_bot: bool = False
    event_id: str = ""
    message_id: str = ""
    groups: tuple[str, ...] = ()
    """The sender's platform groups (Slack user group ids, Discord role ids): what roles
    may be given to (docs/governance.md#roles)."""
    reply_to: str = ""
    """The id of the message this one replies to, where the platform keeps no threads of its
    own (Telegram outside forum topics): a reply to a trigger's header finds its thread."""
    routed: ConversationKey | None = None
    """The conversation the message belongs to when it is not its own place's: a reply in
    a trigger's platform thread belongs to the trigger's conversation (docs/triggers.md)."""
    command: tuple[str, str] | None = field(init=False, default=None, compare=False)
    """(name, arguments) if `text` is one of our commands (`core.command_table`), else None."""

    def __post_init__(self) -> None:
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if (valid := valid_text(value)) is not value:
                object.__setattr__(self, name, valid)  # frozen: set once, while being built
        object.__setattr__(self, "command", parse_command(self.text))

    @property
    def key(self) -> ConversationKey:
        return self.routed or (self.channel, self.channel_id, self.thread_id)

    def routed_to(self, key: ConversationKey) -> Inbound:
        """This message, belonging to the conversation `key`."""
        return replace(self, routed=key)

    def asker(self, conv: str, run_id: str = "") -> Asker:
        """Who asks in this message, where, for the run `run_id` of conversation `conv`."""
        return Asker(self.channel, self.channel_id, self.user_id, self.is_dm, conv, run_id)


@record(frozen=True, slots=True)
class Asker:
    """Who a run answers and where: what per-person state (long-term memory) is scoped by.

    Attributes:
        channel: the platform ("slack", "console").
        channel_id: the platform's channel, chat or DM id.
        user_id: the person whose message started the run ("" for none: a cron job, a
            message re-queued after a restart).
        is_dm: a direct conversation between that person and the bot, no one else in it.
        conv: the conversation id.
        run_id: the run's id ("" outside a run: a command).
    """

    channel: str
    channel_id: str
    user_id: str
    is_dm: bool
    conv: str
    run_id: str = ""


_TEXT_FIELDS = tuple(f.name for f in fields(Inbound) if f.type in ("str", str))


class Deciders(Protocol):
    """Who may answer approval prompts on a platform (docs/governance.md#roles): the
    members of a role that approves. Adapters ask it on each click."""

    def approves(self, channel: str, user_id: str, groups: Sequence[str] = ()) -> bool:
        """Whether user `user_id` of platform `channel`, in `groups`, approves."""
        ...

    def approver_roles(self) -> list[str]:
        """The roles whose members approve, for a refusal to name."""
        ...

    def wants_groups(self, channel: str) -> bool:
        """Whether any role names groups of platform `channel` (else an adapter need not
        look a user's groups up)."""
        ...


@record(frozen=True, slots=True)
class PromptRef:
    """Where an approval prompt was posted: enough for another process to edit it."""

    channel_id: str
    message_id: str
    text: str = ""  # the prompt as posted (some platforms settle it by appending the outcome)


GrantScope = Literal["conversation", "channel"]
"""Where an approver's "approve always" holds: the conversation (a thread, a DM) or the
whole channel it is in."""


class ApprovalRecord(Protocol):
    """The durable side of one approval request (the agent keeps it in the store)."""

    def granted(self, scope: GrantScope, by: str) -> None:
        """Approver `by` chose "always": the tool runs without asking from now on, in
        this conversation or its whole channel (`/grants` lists and revokes it)."""

    def posted(self, prompt: PromptRef) -> None:
        """The prompt is up at `prompt`; remembered so a restarted process can settle it."""

    def answered(self, allowed: bool, by: str) -> None:
        """Approver `by` allowed the call, or denied it ("" for nobody: it timed out)."""

    def outlives_cancellation(self) -> bool:
        """True if a cancellation now is Parley restarting: the request stays pending, its
        prompt keeps its buttons, and the next process takes it up again."""


@record(frozen=True, slots=True)
class ApprovalRequest:
    """An admin tool call waiting for a human's yes or no.

    `timeout` is what is left of the approvers' time. A request asked before a restart
    comes with the `prompt` already posted for it: the channel settles that one and posts
    none; clicks on its buttons still answer it (docs/tools.md#approvals).
    """

    id: str
    tool: str
    summary: str
    reason: str
    timeout: float
    prompt: PromptRef | None = None
    record: ApprovalRecord | None = field(default=None, compare=False, repr=False)
    # The approver may answer "always" (a durable grant): the call is its tool's own
    # category, not one escalated for what this call does (a destructive `bash` command).
    grantable: bool = False


class ReplyStream(Protocol):
    """One streamed answer: fed the run's events, then finished with the full text."""

    def __call__(self, event: LoopEvent) -> None:
        """Take one loop event (text deltas grow the message; others may show status)."""

    async def finish(self, text: str) -> None:
        """Make the reply read exactly `text` (split over several messages if long).
        A silent or empty `text` posts nothing and removes any placeholder. Raises
        `DeliveryFailed` if the platform refused the final text."""


@runtime_checkable
class PreviewStream(ReplyStream, Protocol):
    """A reply stream that shows the answer in chat messages while it grows, and edits
    them into the final text (the chat platforms' streamer; the terminal and unwatched
    runs have none). The agent hooks a run's durability into it."""

    on_posted: Callable[[str], None] | None
    """Told each preview message's id as it is posted (the agent stores them, so a
    preview that a crash left behind can be retracted after the restart)."""

    before_preview: Callable[[], Awaitable[None]] | None
    """Awaited once, before the first preview is posted (the agent commits the run's
    start there: after a crash the run then reads as interrupted, not as never begun)."""

    @property
    def message_ids(self) -> list[str]:
        """Ids of the messages this reply occupies now, in order."""

    async def retract(self, message_ids: list[str], note: str) -> None:
        """Edit the previews `message_ids` (of this conversation, possibly posted by an
        earlier process) to read `note`; best effort: one that cannot be edited stays."""

    async def aclose(self) -> None:
        """Stop its background work now (idempotent); what was shown stays as it is (a run
        lost to another worker stops streaming at once)."""


_PREVIEWS: dict[type, bool] = {}


def previews(stream: ReplyStream) -> TypeGuard[PreviewStream]:
    """Whether `stream` is a `PreviewStream`. Decided once per class: a runtime protocol
    check costs about 15 µs on Python 3.11, and instances of one class have the same
    members."""
    kind = type(stream)
    known = _PREVIEWS.get(kind)
    if known is None:
        known = _PREVIEWS[kind] = isinstance(stream, PreviewStream)
    return known


class Responder(Protocol):
    """Where one conversation's output goes."""

    async def send(self, text: str) -> None:
        """Post a complete message (silent/empty text is skipped). Raises
        `DeliveryFailed` when the platform does not accept it."""

    def stream(self) -> ReplyStream:
        """A new streamed reply for one run."""

    async def approve(self, request: ApprovalRequest) -> bool:
        """Ask the approvers; True only if one of them allowed it before the timeout.
        On timeout the prompt is edited to say it was denied."""

    def typing(self) -> AbstractAsyncContextManager[None]:
        """Shows "typing…" while the block runs; always stops at its end."""


class AgentPort(Protocol):
    """What a channel needs from the agent."""

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        """Queue `inbound` in its conversation's lane (commands act at once). False if the
        platform event was seen before (redelivery) and was dropped.

        Returns once a message is stored (its queued run committed, with the event id), so
        a channel tells its platform "received" only after this returns; if it raises, the
        message is not stored and the platform should deliver it again."""

    async def record_unreadable(self, channel: str, event_id: str, problem: str, raw: str) -> None:
        """Set aside a platform event the channel cannot take in (an update its SDK cannot
        parse, a message without a chat): the event `channel.event.unparsable` keeps `raw`
        (the event as the platform sent it) and `problem` for the operator, once per
        `event_id` (marked seen; "" if it has none).

        Returns once that is committed, so a channel confirms the event only after this
        returns; if it raises, nothing is recorded and the platform should send it again."""

    async def cancel_running(self, key: ConversationKey) -> bool:
        """Stop the run going on in conversation `key` as `/stop` does, but leave what is
        queued (the console's Ctrl-C). True if a run was going on; one that is already
        delivering its answer is let finish. Returns once the run has ended."""

    async def answer_approval(
        self, request_id: str, allow: bool, user_name: str, scope: GrantScope | None = None
    ) -> ApprovalRequest | None:
        """An approver's click on a prompt no run in this process is waiting on (it was
        posted before a restart): the answer is stored for the run that takes the request
        up again, with the grant `scope` names (an "always" answer). The channel checks
        that the user is an approver first.

        Returns the request, with its prompt for the channel to settle, if the answer was
        taken; None if it is not pending here (unknown, already answered, or a run is
        waiting on it right now: the channel's own pending requests have it)."""

    async def approval_refused(
        self, request_id: str, channel: str, user_id: str, user_name: str, groups: Sequence[str]
    ) -> None:
        """A click on request `request_id`'s prompt by user `user_id` of platform
        `channel` (in `groups`), who may not answer it: recorded in the audit log as
        `approval.refused` (docs/governance.md#the-audit-log). Never raises."""
