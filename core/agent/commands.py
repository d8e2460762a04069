"""Chat commands (docs/commands.md): handled before the LLM, the same on every channel.

Read-only commands and `/stop` act at once, even while a run is going; commands that change
the history (`/clear`, `/compact`, `/provider`, `/resume`) wait for an idle lane and say so
otherwise.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from dataclasses import replace

from core.agent.grants import grants_command
from core.agent.lane import Lane, LaneHost
from core.chat import Inbound, Responder
from core.command_table import COMMANDS, Refused, help_text, parse_command
from core.cost.commands import budget_command, cache_status, usage_command
from core.events import discard
from core.instructions.command import instructions_command
from core.memory.command import memory_command
from core.providers.failover import FailoverProvider
from core.sandbox import site_for
from core.store import GoalRow
from core.tools.running import jail_of

HELP = help_text()
_WithInbound = Callable[[Lane, Inbound, str], Awaitable[str | Refused]]


class Commands:
    """The chat commands of one agent, which they see only as a `LaneHost`."""

    def __init__(self, agent: LaneHost) -> None:
        self.agent = agent
        self._handlers: dict[str, Callable[[Lane, str, Responder], Awaitable[str | None]]] = {
            "help": self._help,
            "status": self._status,
            "stop": self._stop,
            "clear": self._clear,
            "compact": self._compact,
            "resume": self._resume,
            "skip": self._skip,
            "provider": self._provider,
            "goal": self._goal,
            "journal": self._journal,
        }
        # Commands that act for the person asking get the whole message.
        self._with_inbound: dict[str, _WithInbound] = {
            "memory": self._memory,
            "instructions": self._instructions,
            "grants": self._grants,
            "usage": self._usage,
            "budget": self._budget,
        }
        handled = set(self._handlers) | set(self._with_inbound)
        if missing := set(COMMANDS) - handled:  # the table and handlers agree
            raise RuntimeError(f"commands without a handler: {sorted(missing)}")

    async def handle(self, lane: Lane, inbound: Inbound, responder: Responder) -> bool:
        """Run `inbound` as a command if it is one; False if it is ordinary text."""
        parsed = inbound.command
        if parsed is None:
            return False
        name, args = parsed
        self.agent.events.emit("agent.command", {"command": name}, conv=lane.conv_id)
        person = self.agent.roles.of(inbound.channel, inbound.user_id, inbound.groups)
        if (refusal := person.command_refusal(name, args)) is not None:
            self._audit(lane, inbound, person.names, f"/{name} {args}", refusal)
            await responder.send(refusal)
            return True
        reply: str | Refused | None = None
        try:
            if name in self._with_inbound:
                reply = await self._with_inbound[name](lane, inbound, args)
            else:
                reply = await self._handlers[name](lane, args, responder)
        finally:
            # After the handler, which may refuse by a rule of its own (`Refused`): every
            # refusal is audited as one, whichever layer made it (docs/governance.md).
            refused = reply.text if isinstance(reply, Refused) else None
            if refused is not None or audited(name, args):
                self._audit(lane, inbound, person.names, f"/{name} {args}", refused)
        text = reply.text if isinstance(reply, Refused) else reply
        if text:
            await responder.send(text)
        return True

    def _audit(
        self, lane: Lane, inbound: Inbound, roles: str, command: str, refusal: str | None
    ) -> None:
        """Record an admin command as `command`, or any refused one (with why) as
        `command.refused` (docs/governance.md#the-audit-log)."""
        actor = f"{inbound.channel}:{inbound.user_id}" if inbound.user_id else inbound.channel
        detail = {"command": command.strip(), "roles": roles}
        if inbound.user_name and inbound.user_name != inbound.user_id:
            detail["name"] = inbound.user_name
        if refusal is not None:
            detail["reason"] = refusal
        kind = "command" if refusal is None else "command.refused"
        self.agent.audit.record(kind, actor, detail, conv=lane.conv_id)

    async def _help(self, lane: Lane, args: str, responder: Responder) -> str:
        return HELP

    async def _status(self, lane: Lane, args: str, responder: Responder) -> str:
        conversation = await self.agent.conversation_of(lane)
        provider = conversation.provider
        window = provider.settings.context_window
        context = conversation.guards.context
        used = (
            context.tokens(conversation.messages)
            if context is not None
            else conversation.counter.messages(conversation.messages)
        )
        sandbox = jail_of(conversation.executor.ctx).describe().removeprefix("sandbox: ")
        site = site_for(conversation.executor.ctx.sandbox, lane.conv_id)
        goal = lane.goal
        goal_text = f"{goal.text} ({goal.state}{', auto' if goal.auto else ''})" if goal else "none"
        # a claimed run whose turn is about to begin counts
        claimed, waiting = await self.agent.dispatcher.waiting(lane)
        run = "running" if lane.working or claimed else "idle"
        if lane.busy and lane.run_id:
            run += f" (run {lane.run_id})"
        elif lane.last_state:
            run += f" (last run: {lane.last_state})"
        if waiting:
            run += f", {waiting} queued"
        subgoal = context.subgoal_status() if context is not None else None
        focus = context.focus_status(conversation.messages) if context is not None else None
        if elsewhere := await self.agent.dispatcher.status(lane):
            run = f"{'busy' if lane.busy else 'idle here'}; {elsewhere}"
        return "\n".join(
            [
                f"Provider: {lane.provider_name} ({provider.model})",
                *_failover_lines(provider),
                f"Context: {used:,} / {window:,} tokens ({used * 100 // max(window, 1)}%)",
                f"Tokens used here: {lane.input_tokens:,} in, {lane.output_tokens:,} out",
                await cache_status(self.agent.ledger, lane.conv_id),
                f"Last compaction: {lane.last_compaction or 'none'}",
                *([f"Subgoal: {subgoal}"] if subgoal is not None else []),
                *([f"Focus: {focus}"] if focus is not None else []),
                f"Goal: {goal_text}",
                f"Run: {run}",
                f"Sandbox: {sandbox}",
                f"Workspace: {site.describe()}",
                *(line[0].upper() + line[1:] for line in self.agent.factory.tool_status()),
            ]
        )

    async def _stop(self, lane: Lane, args: str, responder: Responder) -> str | None:
        """A run stopped here or on another worker says "Stopped." itself (its stream, in
        place of its answer), so the reply does not say it again."""
        # the queued runs are cancelled in the store (never run after a restart)
        dropped, stopped_elsewhere = await self.agent.dispatcher.stop(lane)
        stopped = await lane.stop()
        goal_stopped = await lane.stop_goal()
        if not (stopped or goal_stopped or stopped_elsewhere or dropped):
            return "Nothing is running."
        messages = f"{dropped} queued message{'s' * (dropped != 1)}"
        if stopped or stopped_elsewhere:
            return f"Dropped {messages}." if dropped else None
        return f"Stopped ({messages} dropped)." if dropped else "Stopped."

    async def _clear(self, lane: Lane, args: str, responder: Responder) -> str:
        if lane.busy:
            return BUSY
        await lane.stop_goal()
        async with lane.lock:  # no run may start halfway through
            await self.agent.conversation_of(lane)
            lane.reset()
            await self.agent.store.clear_conversation(lane.conv_id)
        return "Cleared this conversation's history. The provider choice is kept."

    async def _compact(self, lane: Lane, args: str, responder: Responder) -> str:
        if lane.busy:
            return BUSY
        async with lane.lock:  # a message arriving meanwhile waits: nothing is lost
            conversation = await self.agent.conversation_of(lane)
            context = conversation.guards.context
            if context is None or len(conversation.messages) < 2:
                return "Nothing to compact yet."
            await responder.send("Compacting the conversation…")
            report = await context.compact(conversation.messages, sink=discard)
            before, after = report.before, report.after
            lane.compacted(before, after, "manual")
            store = self.agent.store
            store.save_messages(lane.conv_id, conversation.messages)
            lane.save_snapshot(store)
            self.agent.events.emit(
                "agent.compaction.run",
                {"kind": "manual", "before": before, "after": after},
                conv=lane.conv_id,
            )
            await store.flush()
        return f"Compacted: {before:,} → {after:,} tokens."

    async def _resume(self, lane: Lane, args: str, responder: Responder) -> str | None:
        if lane.working:
            return BUSY
        return await self.agent.resume(lane, responder)

    async def _skip(self, lane: Lane, args: str, responder: Responder) -> str:
        if lane.working:
            return BUSY
        return await self.agent.skip(lane)

    async def _provider(self, lane: Lane, args: str, responder: Responder) -> str:
        names = self.agent.factory.provider_names()
        current = await self.agent.provider_for(lane.key)
        if not args:
            listed = ", ".join(f"*{n}*" if n == current else n for n in names)
            return f"Provider here: {current}. Configured: {listed}. Switch with /provider NAME."
        wanted = args.split()[0]
        if wanted not in names:
            return f"There is no provider `{wanted}`. Configured: {', '.join(names)}."
        if lane.busy:
            return BUSY
        await self.agent.prefs.choose(lane.key[0], lane.key[1], wanted)
        # Every conversation of this channel switches at the start of its next run.
        async with lane.lock:
            await self.agent.conversation_of(lane)
        return f"This channel now uses {wanted}."

    async def _goal(self, lane: Lane, args: str, responder: Responder) -> str:
        store = self.agent.store
        try:
            words = shlex.split(args)
        except ValueError:
            words = args.split()
        sub = words[0].lower() if words else ""
        if not sub:
            goal = lane.goal
            if goal is None:
                return "No goal set. /goal create <text> sets one."
            progress = f", auto {goal.turns}/{goal.max_turns} turns" if goal.auto else ""
            return f"Goal: {goal.text} ({goal.state}{progress})"
        if sub == "create":
            rest = words[1:]
            auto = "--auto" in rest
            turns = self.agent.goal_settings.default_turns
            if "--turns" in rest:
                at = rest.index("--turns")
                try:
                    turns = max(1, int(rest[at + 1]))
                except (IndexError, ValueError):
                    return "Usage: /goal create <text> --auto --turns N (N a number)."
                del rest[at : at + 2]
            text = " ".join(w for w in rest if w != "--auto").strip()
            if not text:
                return "Usage: /goal create <text> [--auto [--turns N]]"
            if auto and not self.agent.goal_settings.autonomous_enabled:
                return "Autonomous goals are off here (goals.autonomous_enabled in config.toml)."
            if auto and lane.busy:
                return BUSY
            await lane.stop_goal()  # one driver per conversation
            goal = GoalRow(lane.conv_id, text, "active", auto, turns if auto else 0, 0, None)
            lane.set_goal(goal)
            await store.save_goal(goal, lane.conv_id)
            if auto:
                self.agent.start_goal(lane, responder)
                return f"Goal set: {text}. Working on it autonomously (up to {turns} turns)."
            return f"Goal set: {text}"
        if sub == "done":
            if lane.goal is None:
                return "No goal to complete."
            await lane.stop_goal()
            done = replace(lane.goal, state="completed", note="marked done")
            lane.set_goal(done)
            await store.save_goal(done, lane.conv_id)
            return f"Goal completed: {done.text}"
        if sub == "clear":
            await lane.stop_goal()
            lane.set_goal(None)
            await store.save_goal(None, lane.conv_id)
            return "Goal cleared."
        return "Usage: /goal [create <text> [--auto [--turns N]] | done | clear]"

    async def _journal(self, lane: Lane, args: str, responder: Responder) -> str:
        return lane.journal.journal.render()

    async def _grants(self, lane: Lane, inbound: Inbound, args: str) -> str:
        agent, actor = self.agent, f"{inbound.channel}:{inbound.user_id}"
        return await grants_command(
            agent.store, agent.events, lane.conv_id, args, agent.audit, actor
        )

    async def _memory(self, lane: Lane, inbound: Inbound, args: str) -> str:
        return await memory_command(self.agent.store, inbound.asker(lane.conv_id), args)

    async def _instructions(self, lane: Lane, inbound: Inbound, args: str) -> str:
        return await instructions_command(self.agent, lane, inbound, args)

    async def _usage(self, lane: Lane, inbound: Inbound, args: str) -> str:
        return await usage_command(self.agent.ledger, inbound.asker(lane.conv_id), args)

    async def _budget(self, lane: Lane, inbound: Inbound, args: str) -> str | Refused:
        """Admins see and change budgets: today the channel's approvers (docs/cost.md)."""
        approvers = self.agent.factory.approvers(inbound.channel)
        admin = approvers is None or inbound.user_id in approvers
        asker = inbound.asker(lane.conv_id)
        reply, changed = await budget_command(self.agent.ledger, asker, args, admin)
        if changed:
            data = {"args": args, "by": f"{inbound.channel}:{inbound.user_id}"}
            self.agent.events.emit("budget.changed", data, conv=lane.conv_id)
        return reply


def _failover_lines(provider: object) -> list[str]:
    """The last turn's fallback and the breakers kept open (docs/providers.md#failover)."""
    if not isinstance(provider, FailoverProvider):
        return []
    lines = [f"Last turn answered by fallback {provider.turn_note}"] if provider.turn_note else []
    if out := provider.breakers.describe():
        lines.append(f"Providers kept out: {', '.join(out)}")
    return lines


BUSY = "A run is in progress here; /stop it first or wait for it to finish."

AUDITED = (
    "clear",
    "goal --auto",
    "memory forget",
    "instructions set",
    "instructions clear",
    "grants revoke",
    "budget",
)
"""Commands that change what Parley does or may do: each use goes to the audit log
(docs/governance.md#the-audit-log), as does a `/provider` switch."""


def audited(name: str, args: str) -> bool:
    """Whether `/name args` is an admin command the audit log records."""
    if name == "provider":
        return bool(args.strip())
    words = args.lower().split()
    for rule in AUDITED:
        head, *need = rule.split()
        if head == name and all(word in words for word in need):
            return True
    return False


__all__ = ["COMMANDS", "HELP", "Commands", "parse_command"]
