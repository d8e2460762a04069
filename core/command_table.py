"""The one list of chat commands (docs/commands.md): core handles them, every adapter registers
them.

Slack's `!stop`, Telegram's "/" menu, Discord's slash commands, the console's help line and
the agent's own parser all read this table, so a command added here exists everywhere.
"""

from __future__ import annotations

from typing import Literal

from core.records import record

Scope = Literal["thread", "channel"]


@record(frozen=True, slots=True)
class CommandSpec:
    """One chat command.

    Attributes:
        name: what follows the slash, lower case.
        summary: one line for platform menus (Telegram allows 256 characters, Discord 100).
        usage: the argument synopsis shown in `/help` ("" for none).
        scope: "channel" for commands about the whole channel (they make sense typed at
            channel level on Slack); "thread" for those about one conversation.
    """

    name: str
    summary: str
    usage: str = ""
    scope: Scope = "thread"

    @property
    def takes_args(self) -> bool:
        return bool(self.usage)


COMMAND_TABLE: tuple[CommandSpec, ...] = (
    CommandSpec("help", "What the bot can do", scope="channel"),
    CommandSpec("status", "Provider, model, context use, tokens, goal and run state"),
    CommandSpec("stop", "Stop the running turn"),
    CommandSpec("clear", "Forget this conversation's history (the provider choice stays)"),
    CommandSpec("compact", "Summarise the history now to free context"),
    CommandSpec("resume", "Continue a run that a restart interrupted"),
    CommandSpec("skip", "Drop an interrupted run and go on with the messages after it"),
    CommandSpec(
        "provider", "Show or switch this channel's model provider", "[name]", scope="channel"
    ),
    CommandSpec(
        "goal",
        "Show, create, finish or clear the conversation's goal",
        "[create <text> [--auto [--turns N]] | done | clear]",
    ),
    CommandSpec("journal", "The run journal: objective, state, findings, next step"),
    CommandSpec("memory", "List what I remember here, or forget it", "[forget ID | forget all]"),
    CommandSpec(
        "instructions",
        "Show this chat's instructions; approvers choose them from the library",
        "[list | set NAME | clear]",
        scope="channel",
    ),
    CommandSpec("grants", "Tools approved always here; revoke one", "[revoke ID]"),
    CommandSpec("usage", "What the model calls cost today or this month", "[today | month]"),
    CommandSpec(
        "budget", "The spending budgets; admins raise one", "[set NAME USD]", scope="channel"
    ),
)


@record(frozen=True, slots=True)
class Refused:
    """A command handler's reply when it refuses its sender by a rule of its own (not
    the role's, which is checked before any handler: `/budget set` is for admins). The
    dispatcher sends `text` and audits the refusal as `command.refused`
    (docs/governance.md#the-audit-log)."""

    text: str


COMMANDS: dict[str, CommandSpec] = {spec.name: spec for spec in COMMAND_TABLE}
CHANNEL_WIDE = frozenset(spec.name for spec in COMMAND_TABLE if spec.scope == "channel")


def help_text() -> str:
    """The `/help` reply, one line per command."""
    lines = ["Commands:"]
    for spec in COMMAND_TABLE:
        head = f"/{spec.name} {spec.usage}".rstrip()
        lines.append(f"{head} — {spec.summary}")
    return "\n".join(lines)


def parse_command(text: str) -> tuple[str, str] | None:
    """`/compact now` → ("compact", "now"); None if `text` is not one of our commands.

    A `@botname` suffix (`/status@parley_bot`) is ignored.
    """
    stripped = text.strip()
    if not stripped.startswith("/"):
        return None
    head, _, rest = stripped[1:].partition(" ")
    name = head.split("@", 1)[0].lower()
    return (name, rest.strip()) if name in COMMANDS else None


__all__ = [
    "CHANNEL_WIDE",
    "COMMANDS",
    "COMMAND_TABLE",
    "CommandSpec",
    "Refused",
    "help_text",
    "parse_command",
]
