"""What one conversation is built of, from the running configuration: a tool executor of
its own (the shared registry, its policy, the sandbox, memory and redaction), its provider
(wrapped for failover when it names fallbacks), a context manager, the loop's guards
(loop detection, time limits) and its limits. `bot.app.App.conversation` builds them for
the agent and for the one-shot `parley chat -m`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from bot.config import ParleyConfig
from core.agent.conversation import Conversation
from core.agent.journal import JournalBox
from core.context.manager import ContextManager
from core.context.summarize import provider_summarizer
from core.context.tokens import TokenCounter
from core.instructions import Guidance
from core.loop import Guards, LoopConfig
from core.providers import Provider
from core.providers.failover import Breakers, FailoverProvider
from core.redact import Redactor
from core.resilience import LoopDetector, TimeLimits
from core.sandbox import Jail, site_for
from core.tools.base import ToolContext, ToolRegistry
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy

if TYPE_CHECKING:
    from core.memory.service import Memory  # loaded with the agent's store, not here


class ConversationParts(Protocol):
    """What a conversation is built from (`bot.app.App` holds it all)."""

    config: ParleyConfig
    registry: ToolRegistry
    memory: Memory | None
    jail: Jail
    redactor: Redactor
    counter: TokenCounter
    breakers: Breakers
    guidance: Guidance

    def provider(self, name: str) -> Provider: ...


def build_conversation(
    parts: ConversationParts,
    provider_name: str,
    journal: JournalBox | None = None,
    *,
    policy: ToolPolicy | None = None,
    max_iterations: int | None = None,
) -> Conversation:
    """A conversation with its own executor, context manager and guards."""
    config = parts.config
    agent = config.agent
    journal = journal or JournalBox()
    memory = parts.memory if config.memory.enabled else None
    executor = ToolExecutor(
        parts.registry,
        policy or ToolPolicy(session="interactive"),
        ToolContext(sandbox=config.tools, journal=journal, memory=memory, jail=parts.jail),
        redact=parts.redactor,
    )
    provider = parts.provider(provider_name)
    if fallbacks := config.providers[provider_name].fallbacks:  # per turn, shared breakers
        chain = [parts.provider(name) for name in fallbacks]
        provider = FailoverProvider(provider, chain, parts.breakers)
    summary = parts.provider(agent.summary_provider) if agent.summary_provider else provider
    context = ContextManager(
        window=provider.settings.context_window,
        counter=parts.counter,
        summarizer=provider_summarizer(summary),
        settings=config.context,
        # A run outside any conversation's (a turn sets its conversation's own).
        artifacts_dir=site_for(config.tools, "").artifacts,
        session=executor.policy.session,
        after_summary=journal.render_full,
    )
    guards = Guards(
        context=context,
        detector=LoopDetector() if agent.loop_detection else None,
        limits=TimeLimits(agent.soft_time_limit_seconds, agent.hard_time_limit_seconds),
    )
    return Conversation(
        provider=provider,
        executor=executor,
        counter=parts.counter,
        system_prompt=agent.system_prompt,
        instructions=parts.guidance.instructions(),
        skills=parts.guidance.skills_index(),
        loop_config=LoopConfig(
            max_iterations=max_iterations or agent.max_iterations,
            cancel_grace=agent.cancel_grace_seconds,
            parallel_reads=agent.parallel_read_tools,
        ),
        guards=guards,
    )
