"""Roles (docs/governance.md#roles): who may use which tools and commands, and who approves.

`[roles]` in config.toml maps platform users and groups to named roles. Each role says
which tool categories and which tools it may use, which chat commands, and whether its
members answer approval prompts. A person in several roles has what any of them allows;
a person in none has the `default` role; whoever runs Parley in the terminal has the
`terminal` role. Two roles are built in and keep what Parley did before roles existed:

- `admin`: every tool and command, and approves. Every platform's `approvers` are in it.
- `member`: every tool (admin tools still ask an approver) and every command but
  choosing the chat's instructions (`/instructions set`, `/instructions clear`).

A `[roles.admin]` or `[roles.member]` table changes the built-in role: the keys it sets
replace the built-in's, the others stay (`[roles.admin] members = […]` only adds members).
A role is a permission on top of the run's own policy (`core.tools.policy`): a tool runs
only if both allow it.

A command rule is a command name, optionally followed by words that must all appear in
the invocation, in order: `provider`, `goal --auto`, `memory forget all`, `grants revoke`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Collection, Sequence
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from core.command_table import COMMANDS
from core.records import record

Category = Literal["read", "write", "admin"]
ALL_CATEGORIES: tuple[Category, ...] = ("read", "write", "admin")
RESERVED_COMMANDS = frozenset({"budget", "usage"})
"""Commands a role may name before this build has them (docs/governance.md#roles)."""
_ROLE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")
_MEMBER = re.compile(r"^([a-z][a-z0-9_]*):(?:(group|role):)?([^\s:]+)$")
TERMINAL = "console"  # the channel type of the terminal


class RoleFixable(ValueError):
    """A problem whose fix is known (reported by core.config like its own)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.fix = fix


def _command_rule(rule: str) -> str:
    words = rule.strip().lstrip("/").split()
    if not words:
        raise RoleFixable("an empty command rule", 'write a command name, e.g. "provider"')
    name = words[0].lower()
    if name != "*" and name not in COMMANDS and name not in RESERVED_COMMANDS:
        known = ", ".join(sorted({*COMMANDS, *RESERVED_COMMANDS}))
        raise RoleFixable(f"`/{name}` is not a command", f'use "*" or one of the commands: {known}')
    return " ".join([name, *words[1:]])


def _member(member: str) -> str:
    if member == TERMINAL or member.startswith(f"{TERMINAL}:"):
        raise RoleFixable(
            f"`{member}`: the terminal user's role is set by `roles.terminal`",
            'remove it and set `terminal = "<role>"` under [roles]',
        )
    if _MEMBER.match(member) is None:
        raise RoleFixable(
            f"`{member}` is not a member",
            'write "<platform>:<user id>" or "<platform>:group:<group id>", e.g. '
            '"slack:U012ABCDEF", "discord:group:112233445566778899"',
        )
    return member


CommandRule = Annotated[str, AfterValidator(_command_rule)]
Member = Annotated[str, AfterValidator(_member)]


class RoleConfig(BaseModel):
    """One role (`[roles.<name>]`)."""

    model_config = ConfigDict(extra="forbid")

    categories: list[Category] = Field(
        default_factory=lambda: list(ALL_CATEGORIES),
        description="Tool categories the role may use (read, write, admin).",
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Tools allowed besides the categories: names or glob patterns, MCP "
        "tools included (`notes_*`).",
    )
    deny_tools: list[str] = Field(
        default_factory=list, description="Tools refused even if a category allows them."
    )
    commands: list[CommandRule] = Field(
        default_factory=lambda: ["*"],
        description='Command rules the role may use ("*": all).',
        examples=[["help", "status", "goal", "memory"]],
    )
    deny_commands: list[CommandRule] = Field(
        default_factory=list,
        description="Command rules refused even if `commands` allows them.",
        examples=[["goal --auto", "memory forget all"]],
    )
    approves: bool = Field(False, description="Its members answer approval prompts.")
    members: list[Member] = Field(
        default_factory=list,
        description="`<platform>:<user id>` or `<platform>:group:<group id>` (Slack user "
        "groups, Discord roles).",
        examples=[["slack:U012ABCDEF", "slack:group:S0123ABCD", "discord:group:1122334455"]],
    )


BUILT_IN: dict[str, RoleConfig] = {
    "admin": RoleConfig(approves=True),
    "member": RoleConfig(deny_commands=["instructions set", "instructions clear"]),
}


class RolesConfig(BaseModel):
    """`[roles]`: `default`, `terminal`, and one `[roles.<name>]` table per role."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, RoleConfig] = Field(init=False)

    default: str = Field("member", description="The role of everyone no role lists.")
    terminal: str = Field("admin", description="The role of whoever runs Parley's console.")

    def roles(self) -> dict[str, RoleConfig]:
        """Every role: the built-in ones, replaced or joined by the configured ones."""
        roles = dict(BUILT_IN)
        for name, role in (self.__pydantic_extra__ or {}).items():
            base = BUILT_IN.get(name)
            given = {key: getattr(role, key) for key in role.model_fields_set}
            roles[name] = base.model_copy(update=given) if base is not None else role
        return roles

    @model_validator(mode="after")
    def _names(self) -> RolesConfig:
        for name in self.__pydantic_extra__ or {}:
            if _ROLE_NAME.match(name) is None:
                raise RoleFixable(
                    f"`{name}` is not a usable role name",
                    "use lower-case letters, digits, `-` and `_`, starting with a letter",
                )
        known = self.roles()
        for key in ("default", "terminal"):
            name = getattr(self, key)
            if name not in known:
                raise RoleFixable(
                    f'`{key} = "{name}"` names no role',
                    f"use one of: {', '.join(sorted(known))}, or add [roles.{name}]",
                )
        return self


def _matches(rule: str, name: str, args: str) -> bool:
    """Whether command rule `rule` covers `/name args`: the name, then each of the rule's
    words among the invocation's, in order."""
    head, *words = rule.split()
    if head not in ("*", name):
        return False
    given = iter(args.lower().split())
    return all(any(word == w for w in given) for word in (w.lower() for w in words))


@record(frozen=True, slots=True)
class Role:
    """One role, resolved from its configuration."""

    name: str
    categories: frozenset[str]
    tools: tuple[str, ...]
    deny_tools: tuple[str, ...]
    commands: tuple[str, ...]
    deny_commands: tuple[str, ...]
    approves: bool

    @classmethod
    def of(cls, name: str, config: RoleConfig) -> Role:
        return cls(
            name,
            frozenset(config.categories),
            tuple(config.tools),
            tuple(config.deny_tools),
            tuple(config.commands),
            tuple(config.deny_commands),
            config.approves,
        )

    def allows_tool(self, tool: str, category: str) -> bool:
        if any(fnmatch.fnmatchcase(tool, p) for p in self.deny_tools):
            return False
        return category in self.categories or any(fnmatch.fnmatchcase(tool, p) for p in self.tools)

    def allows_command(self, name: str, args: str) -> bool:
        if any(_matches(rule, name, args) for rule in self.deny_commands):
            return False
        return any(_matches(rule, name, args) for rule in self.commands)


@record(frozen=True, slots=True)
class Person:
    """What one person may do: the union of their roles (`core.tools.base.RoleGate`)."""

    roles: tuple[Role, ...]
    everyone: Roles  # to name the roles a refusal needs

    @property
    def names(self) -> str:
        return ", ".join(r.name for r in self.roles)

    @property
    def approves(self) -> bool:
        return any(r.approves for r in self.roles)

    def allows_tool(self, tool: str, category: str) -> bool:
        return any(r.allows_tool(tool, category) for r in self.roles)

    def allows_command(self, name: str, args: str) -> bool:
        return any(r.allows_command(name, args) for r in self.roles)

    def tool_refusal(self, tool: str, category: str) -> str | None:
        """Why this person may not use `tool` (a call of `category`), naming the roles
        that may; None if they may."""
        if self.allows_tool(tool, category):
            return None
        needed = (
            self.everyone.needed(lambda r: r.allows_tool(tool, category)) if self.everyone else ""
        )
        return f"role: `{tool}` ({category}) is not allowed for your role ({self.names}); {needed}"

    def command_refusal(self, name: str, args: str) -> str | None:
        """Why this person may not run `/name args`, naming the roles that may; None if
        they may."""
        if self.allows_command(name, args):
            return None
        shown = f"/{name} {args}".strip()
        needed = (
            self.everyone.needed(lambda r: r.allows_command(name, args)) if self.everyone else ""
        )
        return f"`{shown}` is not allowed for your role ({self.names}); {needed}."


class Roles:
    """Roles from `[roles]`, and who has which (`core.chat.Deciders`)."""

    def __init__(
        self,
        config: RolesConfig | None = None,
        approvers: Callable[[str], Collection[str] | None] | None = None,
    ) -> None:
        """`approvers(channel)`: the platform's `approvers` setting (in the `admin`
        role); None for the terminal."""
        self._approvers = approvers or (lambda channel: None if channel == TERMINAL else ())
        self.reconfigure(config or RolesConfig())

    def reconfigure(self, config: RolesConfig) -> None:
        """Take `config` (a reload): the next message, click and run follow it."""
        self.config = config
        self.by_name = {name: Role.of(name, c) for name, c in config.roles().items()}
        self._users: dict[str, list[str]] = {}
        self._groups: dict[str, list[str]] = {}
        for name, role in config.roles().items():
            for member in role.members:
                m = _MEMBER.match(member)
                assert m is not None  # validated
                platform, group, ident = m[1], m[2], m[3]
                table = self._groups if group else self._users
                table.setdefault(f"{platform}:{ident}", []).append(name)
        self.group_platforms = frozenset(k.split(":", 1)[0] for k in self._groups)

    def of(self, channel: str, user_id: str, groups: Sequence[str] = ()) -> Person:
        """The roles of user `user_id` (in platform `groups`) on `channel`; the default
        role for a person no role lists, or for nobody (`user_id` "")."""
        if channel == TERMINAL:
            return self._person([self.config.terminal])
        names: list[str] = []
        if user_id:
            names += self._users.get(f"{channel}:{user_id}", [])
            for group in groups:
                names += self._groups.get(f"{channel}:{group}", [])
            listed = self._approvers(channel)
            if listed is not None and user_id in listed:
                names.append("admin")
        return self._person(names or [self.config.default])

    def _person(self, names: list[str]) -> Person:
        unique = dict.fromkeys(names)
        return Person(tuple(self.by_name[n] for n in unique if n in self.by_name), self)

    def needed(self, allows: Callable[[Role], bool]) -> str:
        """The roles for which `allows` holds, as a refusal says them."""
        names = [r.name for r in self.by_name.values() if allows(r)]
        if not names:
            return "no role allows it"
        return f"it needs the role {' or '.join(names)}"

    # --- core.chat.Deciders ------------------------------------------------------------

    def approves(self, channel: str, user_id: str, groups: Sequence[str] = ()) -> bool:
        return self.of(channel, user_id, groups).approves

    def approver_roles(self) -> list[str]:
        return [r.name for r in self.by_name.values() if r.approves]

    def wants_groups(self, channel: str) -> bool:
        return channel in self.group_platforms


__all__ = ["BUILT_IN", "Person", "Role", "RoleConfig", "Roles", "RolesConfig"]
