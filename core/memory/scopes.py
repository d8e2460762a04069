"""Which memories a run may see, and where it may put new ones: the privacy rule.

A run sees the scopes of the place it answers in:
    - its conversation;
    - its channel (a channel, group chat or DM, across its threads);
    - its team (everything the bot sees on that platform);
    - the asking person's own `user` scope, only in a DM between that person and the
      bot: what is personal is never recalled where anyone else reads the answer.

It may write to those, and to the asking person's own `user` scope from anywhere (what
they tell the bot about themselves in a channel is theirs; it comes back in their DM).
Nobody can reach another person's `user` scope.
"""

from __future__ import annotations

from core.chat import Asker
from core.errors import ToolError
from core.store import Scope, ScopeKind

DESCRIPTIONS: dict[ScopeKind, str] = {
    "conversation": "this conversation only",
    "user": "your personal memory, recalled only in your direct messages with me",
    "channel": "everyone in this channel",
    "team": "everyone who talks to me on this platform",
}


class ScopeNotAllowed(ToolError):
    """The asked-for scope is not one the asking person may write to here."""


def user_scope(asker: Asker) -> Scope | None:
    """The asking person's own scope; None when no person asked."""
    return Scope("user", f"{asker.channel}:{asker.user_id}") if asker.user_id else None


def visible_scopes(asker: Asker) -> list[Scope]:
    """The scopes a recall for `asker` may return memories of (see the module's rule)."""
    scopes: list[Scope] = []
    if asker.conv:
        scopes.append(Scope("conversation", asker.conv))
    if (own := user_scope(asker)) is not None and asker.is_dm:
        scopes.append(own)
    if asker.channel_id:
        scopes.append(Scope("channel", f"{asker.channel}:{asker.channel_id}"))
    if asker.channel:
        scopes.append(Scope("team", asker.channel))
    return scopes


def writable_scopes(asker: Asker) -> list[Scope]:
    """The scopes `asker` may put memories in or forget them from: the visible ones and
    their own."""
    scopes = visible_scopes(asker)
    if (own := user_scope(asker)) is not None and own not in scopes:
        scopes.append(own)
    return scopes


def scope_for(kind: ScopeKind, asker: Asker) -> Scope:
    """The scope of `kind` that `asker` writes to here.

    Raises:
        ScopeNotAllowed: there is none (no person asked, for `user`).
    """
    for scope in writable_scopes(asker):
        if scope.kind == kind:
            return scope
    raise ScopeNotAllowed(f"there is no {kind} scope here (nobody asked); use `conversation`")
