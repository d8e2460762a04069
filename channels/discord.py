"""The Discord channel (discord.py 2.x): gateway in, REST out (docs/channels.md).

Answers DMs, mentions in guild channels and messages in threads the bot is part of, in
the same channel or thread. The nine agent commands are app (slash) commands on a
`CommandTree`, synced at start; an invocation is acknowledged at once with an ephemeral
note to the invoker and becomes Inbound text "/name args"; the agent's replies to it are
ordinary channel posts (they work past the 15-minute interaction token and share the
channel's edit budget). Approvals are buttons; clicks are handled here by custom_id, so
a click on a prompt posted before a restart is still answered.

discord.py has no endpoint option: `start()` points two class attributes at the
configured REST root and gateway (process-wide, like the library itself).

This module is the adapter's lifecycle, its gateway client and its handlers; beside it are
the library's edge and its error mapping (`discord_api`), where answers go
(`discord_reply`) and the settings (`discord_config`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import warnings
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import aiohttp

from channels.approvals import (
    ALWAYS_LABELS,
    Approvals,
    approval_button_id,
    duration_text,
    parse_approval_button,
)
from channels.discord_api import MAX_RATELIMIT_WAIT, discord_call, point_library_at
from channels.discord_config import DiscordConfig
from channels.discord_reply import DiscordResponder, start_thread
from channels.gate import Gate
from channels.inbound import discord_markdown
from channels.retry import call_with_retry
from channels.stream import EditBudget
from core.chat import AgentPort, ApprovalRequest, ConversationKey, Deciders, Inbound, PromptRef
from core.clock import Clock, SystemClock
from core.command_table import COMMAND_TABLE
from core.errors import ChannelError, ConfigError
from core.lease import Singleton

with warnings.catch_warnings():
    # discord.py imports `audioop` (voice support), deprecated since Python 3.11.
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    import discord
    from discord import app_commands

__all__ = ["DiscordChannel"]

log = logging.getLogger(__name__)

EDITS_PER_WINDOW, EDIT_WINDOW = 5, 5.0  # Discord: 5 message edits per 5 s per channel
CONNECT_TIMEOUT = 30.0
STOP_GRACE = 5.0  # inbound events still being handed to the agent at stop()
# on_ready waits this long after the last GUILD_CREATE; nothing here needs on_ready.
GUILD_READY_TIMEOUT = 0.5
INTENTS = discord.Intents(guilds=True, guild_messages=True, dm_messages=True, message_content=True)
ANSWERED_TYPES = (discord.MessageType.default, discord.MessageType.reply)


class _Client(discord.Client):
    """discord.Client that hands events to the adapter."""

    def __init__(
        self, adapter: DiscordChannel, shard_id: int | None = None, shard_count: int | None = None
    ) -> None:
        super().__init__(
            shard_id=shard_id,  # one gateway shard (leased), or None: the only one
            shard_count=shard_count,
            intents=INTENTS,
            guild_ready_timeout=GUILD_READY_TIMEOUT,
            allowed_mentions=discord.AllowedMentions.none(),  # model output pings nobody
            max_ratelimit_timeout=MAX_RATELIMIT_WAIT,
        )
        self.adapter = adapter
        self.tree: app_commands.CommandTree[_Client] = app_commands.CommandTree(self)
        self.connected = asyncio.Event()
        for spec in COMMAND_TABLE:
            callback = _command_with_args if spec.takes_args else _command
            self.tree.add_command(
                app_commands.Command(name=spec.name, description=spec.summary, callback=callback)
            )

    async def on_connect(self) -> None:
        self.connected.set()

    async def on_message(self, message: discord.Message) -> None:
        async with self.adapter.handling():
            await self.adapter.on_message(message, self)

    async def on_interaction(self, interaction: discord.Interaction[_Client]) -> None:
        if interaction.type is discord.InteractionType.component:
            await self.adapter.on_button(interaction)


async def _command(interaction: discord.Interaction[_Client]) -> None:
    async with interaction.client.adapter.handling():
        await interaction.client.adapter.on_command(interaction, None)


@app_commands.describe(args="Arguments, e.g. a provider name or `create <text> --auto`")
async def _command_with_args(
    interaction: discord.Interaction[_Client], args: str | None = None
) -> None:
    async with interaction.client.adapter.handling():
        await interaction.client.adapter.on_command(interaction, args)


class DiscordChannel:
    """The Discord adapter (`channels.base.Channel`); each `ApprovalRequest` carries the
    timeout that applies to it."""

    name = "discord"

    def __init__(
        self,
        config: DiscordConfig,
        environ: Mapping[str, str],
        *,
        clock: Clock | None = None,
        deciders: Deciders | None = None,
    ) -> None:
        token = environ.get(config.token_env, "").strip()
        if not token:
            raise ConfigError(
                "channels.discord.token_env",
                f"the environment variable {config.token_env} is not set",
                f"export {config.token_env}=<bot token from the Discord developer portal>",
            )
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self._token = token
        self._gate = Gate(config, self.clock)
        self._approvals = Approvals(
            config.approvers, self.clock, deciders=deciders, platform=self.name
        )
        self._budgets: dict[int, EditBudget] = {}
        self._threads: set[int] = set()  # threads the bot answered in or opened
        self._client: _Client | None = None
        self._handling: set[asyncio.Task[Any]] = set()
        self._gateway: asyncio.Task[None] | None = None
        self._agent: AgentPort | None = None
        self._leased = False  # gateway shards are leased singletons, run by the caller
        self._shards: dict[int, asyncio.Task[None]] = {}  # unleased, shard_count > 1

    # ---------------------------------------------------------------- lifecycle

    def client(self) -> _Client:
        if self._client is None:
            raise ChannelError("the Discord channel is not started")
        return self._client

    async def start(self, agent: AgentPort) -> None:
        """Log in, sync the app commands, connect the gateway and wait for its READY."""
        self._agent = agent
        point_library_at(self.config)
        client = _Client(self)
        try:
            await client.login(self._token)
            if self.config.sync_commands:
                await client.tree.sync()
        except (discord.DiscordException, aiohttp.ClientError, OSError) as exc:
            await client.close()
            raise ChannelError(f"Discord login failed: {exc}") from exc
        self._client = client  # REST (replies, approvals) works without a gateway
        if self._leased or self.config.shard_count > 1:
            if not self._leased:  # one process holds every shard
                for n in range(self.config.shard_count):
                    task = asyncio.create_task(self._run_shard(n), name=f"discord shard {n}")
                    task.add_done_callback(_log_gateway_end)
                    self._shards[n] = task
            return
        self._gateway = asyncio.create_task(client.connect(), name="discord-gateway")
        self._gateway.add_done_callback(_log_gateway_end)
        connected = asyncio.create_task(client.connected.wait())
        try:
            done, _ = await asyncio.wait(
                {connected, self._gateway}, timeout=CONNECT_TIMEOUT, return_when="FIRST_COMPLETED"
            )
        except asyncio.CancelledError:
            await self.stop()
            raise
        finally:
            connected.cancel()
            await asyncio.wait({connected})
        if self._gateway in done:
            error = self._gateway.exception()
            await self.stop()
            raise ChannelError(f"Discord gateway closed at start: {error}") from error
        if not done:
            log.warning("Discord gateway not connected after %.0f s; still trying", CONNECT_TIMEOUT)

    def singletons(self) -> list[Singleton]:
        """Each gateway shard, for the caller to run while it holds `discord:shard:<n>`
        (several workers on one store); `start` then logs in for REST only, so replies
        and approval prompts post from any worker."""
        self._leased = True
        return [
            Singleton(f"discord:shard:{n}", functools.partial(self._run_shard, n))
            for n in range(self.config.shard_count)
        ]

    async def _run_shard(self, shard: int) -> None:
        """One gateway shard on its own client, until cancelled (or it gives up)."""
        client = _Client(self, shard_id=shard, shard_count=self.config.shard_count)
        try:
            await client.login(self._token)
            await client.connect()
        finally:
            await client.close()

    @contextlib.asynccontextmanager
    async def handling(self) -> AsyncIterator[None]:
        """Tracks the task of one inbound event (discord.py spawns it), so `stop` can let
        it finish."""
        task = asyncio.current_task()
        if task is not None:
            self._handling.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._handling.discard(task)

    async def stop(self) -> None:
        if self._handling:  # inbound events being handed to the agent
            pending = set(self._handling)
            _, late = await asyncio.wait(pending, timeout=STOP_GRACE)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        shards, self._shards = self._shards, {}
        for task in shards.values():
            task.cancel()
        await asyncio.gather(*shards.values(), return_exceptions=True)
        client, self._client = self._client, None
        gateway, self._gateway = self._gateway, None
        if client is not None:
            await client.close()
        if gateway is not None:
            with contextlib.suppress(Exception):
                await gateway

    def responder(self, key: ConversationKey) -> DiscordResponder:
        _, channel_id, thread_id = key
        try:
            target = int(thread_id or channel_id)
        except ValueError:
            raise ChannelError(f"not a Discord channel id: {thread_id or channel_id!r}") from None
        return DiscordResponder(self, target)

    async def open_thread(self, channel_id: str, header: str) -> str:
        """The id of the thread started on the header (`discord_reply.start_thread`); see
        `channels.base`. Its replies reach the agent unmentioned, as in any bot thread."""
        thread = await start_thread(self, channel_id, header)
        self._threads.add(int(thread))
        return thread

    def access(self) -> str:
        return self.config.who()

    def edit_budget(self, channel_id: int) -> EditBudget:
        """The edit budget of one Discord channel (a thread counts as its own channel)."""
        budget = self._budgets.get(channel_id)
        if budget is None:
            budget = EditBudget(EDITS_PER_WINDOW, EDIT_WINDOW, self.clock)
            self._budgets[channel_id] = budget
        return budget

    # ---------------------------------------------------------------- inbound

    async def on_message(
        self, message: discord.Message, client: discord.Client | None = None
    ) -> None:
        """A gateway message; `client` is the shard's client that received it."""
        me = self.client().user
        if self._agent is None or me is None or message.type not in ANSWERED_TYPES:
            return
        channel = message.channel
        thread = channel if isinstance(channel, discord.Thread) else None
        mentioned = me.id in message.raw_mentions
        inbound = Inbound(
            channel=self.name,
            channel_id=str(thread.parent_id if thread else channel.id),
            thread_id=str(thread.id) if thread else "",
            user_id=str(message.author.id),
            user_name=message.author.display_name,
            text=self._markdown(message, me.id, client or self.client()),
            is_dm=message.guild is None,
            mentions_bot=mentioned,
            event_id=str(message.id),  # stable across a gateway RESUME's redelivery
            message_id=str(message.id),
            groups=_role_ids(message.author),
        )
        in_bot_thread = thread is not None and (
            thread.me is not None or thread.owner_id == me.id or thread.id in self._threads
        )
        admitted = self._gate.admit(
            inbound,
            from_bot=message.author.bot,
            from_self=message.author.id == me.id,
            in_bot_thread=in_bot_thread,
        )
        if not admitted or not inbound.text:
            return
        if thread is not None:
            self._threads.add(thread.id)
        await self._agent.submit(inbound, DiscordResponder(self, channel.id))

    def _markdown(self, message: discord.Message, bot_id: int, client: discord.Client) -> str:
        """The message as the agent reads it: without the bot's own mention, other mentions
        named (users and roles from the message, channels from the client's cache).
        `message.content` stays as Discord sent it."""
        channels: dict[int, str] = {}
        for channel_id in message.raw_channel_mentions:
            channel = client.get_channel(channel_id)
            if isinstance(name := getattr(channel, "name", None), str):
                channels[channel_id] = name
        return discord_markdown(
            _without_mention(message.content, bot_id),
            users={user.id: user.display_name for user in message.mentions},
            channels=channels,
            roles={role.id: role.name for role in message.role_mentions},
        )

    async def on_command(self, interaction: discord.Interaction[_Client], args: str | None) -> None:
        """A slash command: acknowledge it at once, then hand "/name args" to the agent."""
        command = interaction.command
        if self._agent is None or command is None or interaction.channel_id is None:
            return
        text = f"/{command.name} {args.strip()}" if args and args.strip() else f"/{command.name}"
        channel = interaction.channel
        thread = channel if isinstance(channel, discord.Thread) else None
        inbound = Inbound(
            channel=self.name,
            channel_id=str(thread.parent_id if thread else interaction.channel_id),
            thread_id=str(thread.id) if thread else "",
            user_id=str(interaction.user.id),
            user_name=interaction.user.display_name,
            text=text,
            is_dm=interaction.guild_id is None,
            mentions_bot=True,  # a slash command is addressed to the bot
            event_id=f"interaction:{interaction.id}",
            groups=_role_ids(interaction.user),
        )
        admitted = self._gate.admit(
            inbound, from_bot=interaction.user.bot, from_self=False, in_bot_thread=True
        )
        note = f"➜ `{text[:1900]}`" if admitted else "You are not allowed to use this bot here."
        try:
            await discord_call(interaction.response.send_message(note, ephemeral=True))
        except ChannelError as exc:
            log.warning("Discord: could not acknowledge /%s: %s", command.name, exc)
        if admitted:
            await self._agent.submit(inbound, DiscordResponder(self, interaction.channel_id))

    async def on_button(self, interaction: discord.Interaction[_Client]) -> None:
        """An approval button: only approvers resolve it; anyone else is told privately."""
        data = cast("dict[str, Any]", interaction.data or {})
        custom_id = data.get("custom_id")
        parsed = parse_approval_button(custom_id) if isinstance(custom_id, str) else None
        if parsed is None:
            return
        user = interaction.user
        outcome = await self._approvals.resolve_click(
            parsed.request_id,
            str(user.id),
            user.display_name,
            parsed.allow,
            agent=self._agent,
            settle=self._settle_prompt,
            scope=parsed.scope,
            groups=_role_ids(user),
        )
        if outcome == "ok":
            await discord_call(interaction.response.defer())  # the prompt is edited by settle
        elif outcome == "not_approver":
            refusal = self._approvals.refusal()
            await discord_call(interaction.response.send_message(refusal, ephemeral=True))
        else:
            gone = "This request is no longer waiting for an answer."
            await discord_call(interaction.response.send_message(gone, ephemeral=True))

    # ---------------------------------------------------------------- approvals

    async def ask_approval(self, target: int, request: ApprovalRequest) -> bool:
        async def show(req: ApprovalRequest) -> PromptRef:
            text = _prompt_text(req)
            channel = self.client().get_partial_messageable(target)
            message = await call_with_retry(
                lambda: discord_call(channel.send(text, view=_approval_view(req))),
                clock=self.clock,
                what="Discord approval prompt",
            )
            return PromptRef(str(target), str(message.id), text)

        return await self._approvals.request(request, show, self._settle_prompt)

    async def _settle_prompt(self, request: ApprovalRequest, outcome: str) -> None:
        """Edit the prompt to show the outcome; its buttons go."""
        prompt = request.prompt
        if prompt is None:
            return
        partial = self.client().get_partial_messageable(int(prompt.channel_id))
        message = partial.get_partial_message(int(prompt.message_id))
        await call_with_retry(
            lambda: discord_call(message.edit(content=f"{prompt.text}\n{outcome}", view=None)),
            clock=self.clock,
            what="Discord approval settle",
        )


def _log_gateway_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("Discord gateway stopped: %r", exc)


def _without_mention(content: str, bot_id: int) -> str:
    return re.sub(rf"\s*<@!?{bot_id}>\s*", " ", content).strip()


def _prompt_text(request: ApprovalRequest) -> str:
    summary = request.summary.replace("```", "`\u200b``")
    if len(summary) > 1200:
        summary = summary[:1200] + "…"
    return (
        f"⚠️ **Approval needed** for `{request.tool}`: {request.reason[:300]}\n"
        f"```\n{summary}\n```\n"
        f"An approver has {duration_text(request.timeout)} to answer; no answer denies it."
    )


def _approval_view(request: ApprovalRequest) -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    buttons: list[tuple[str, str, discord.ButtonStyle]] = [
        ("Approve", approval_button_id(request.id, True), discord.ButtonStyle.success)
    ]
    if request.grantable:
        buttons += [
            (label, approval_button_id(request.id, True, scope), discord.ButtonStyle.primary)
            for scope, label in ALWAYS_LABELS.items()
        ]
    buttons.append(("Deny", approval_button_id(request.id, False), discord.ButtonStyle.danger))
    for label, custom_id, style in buttons:
        view.add_item(discord.ui.Button(label=label, style=style, custom_id=custom_id))
    # Clicks are handled by custom_id in on_button (also after a restart); a stopped view
    # is only rendered, never stored in discord.py's view store.
    view.stop()
    return view


def _role_ids(author: discord.User | discord.Member) -> tuple[str, ...]:
    """A guild member's role ids (not the guild's @everyone), what roles may name as
    `discord:group:<id>`; none for a user outside a guild (a DM)."""
    if not isinstance(author, discord.Member):
        return ()
    return tuple(str(role.id) for role in author.roles if not role.is_default())
