"""Where one run's tools work: the workspace of its channel or conversation
(`workspace_scope`), the run's own temp dir and its conversation's artifacts.

Everything here follows from the conversation id (`slack:C0123:1700000000.0001`) and the
run's scratch dir, so the executor, the turn and `/status` compute the same site. A child
run (`…:child:<run id>`) works where the conversation that delegated it does: its answer
and its artifacts are the parent's to read. A run outside any conversation
(`parley chat -m`) has artifacts of its own (`one_off_site`).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from pathlib import Path

from core.records import record
from core.sandbox.settings import SandboxSettings

CHILD_MARK = ":child:"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_SLUG_LEN = 40
_SITES_KEPT = 256


def owner_conversation(conv: str) -> str:
    """The conversation a run's files belong to: a child run's is its root parent's."""
    return conv.split(CHILD_MARK, 1)[0]


def _digest(key: str, length: int) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:length]


def dir_name(key: str) -> str:
    """A directory name for `key`: readable, safe on any filesystem, unique by its hash
    (`slack:C0123` → `slack-C0123-3f2a…`). Never `.`, `..` or empty, never a path."""
    slug = _UNSAFE.sub("-", key).strip("-.")[:_SLUG_LEN].rstrip("-.") or "conversation"
    return f"{slug}-{_digest(key, 10)}"


@record(frozen=True, slots=True)
class ToolSite:
    """The directories one run's tools may use.

    Attributes:
        workspace: read-write; bash's working directory, the file tools' base.
        scratch: the run's own temp dir (HOME and TMPDIR of tools); None: a fresh one per
            call (a run outside the store).
        artifacts: the conversation's cut tool outputs; readable by its tools, written
            only by Parley.
        conversation: the owner conversation's id ("" for a run outside any).
        scope: what shares `workspace`, for `/status`: "channel slack:C0123",
            "conversation slack:C0123:1700.1", or "shared".
    """

    workspace: Path
    scratch: Path | None
    artifacts: Path
    conversation: str
    scope: str

    def describe(self) -> str:
        """One line for `/status`."""
        return f"{self.workspace} ({self.scope})"


def site_for(sandbox: SandboxSettings, conv: str, scratch: Path | None = None) -> ToolSite:
    """The site of a run of conversation `conv` with the scratch dir `scratch` (kept with
    the settings for the most recent runs: the executor asks for it at every call).

    A run outside any conversation (`conv` == "": a one-off call, a test) works in the
    workspace root, as every run did before scopes existed.
    """
    sites: OrderedDict[tuple[str, Path | None], ToolSite] = sandbox._cache.setdefault(
        "sites", OrderedDict()
    )
    site = sites.get((conv, scratch))
    if site is None:
        site = sites[(conv, scratch)] = _site(sandbox, conv, scratch)
        if len(sites) > _SITES_KEPT:
            sites.popitem(last=False)
    return site


def _site(sandbox: SandboxSettings, conv: str, scratch: Path | None) -> ToolSite:
    owner = owner_conversation(conv)
    root = sandbox.resolved_workspace()
    mode = sandbox.workspace_scope
    if mode == "shared" or not owner:
        workspace, scope = root, "shared"
    else:
        key = owner if mode == "conversation" else ":".join(owner.split(":", 2)[:2])
        workspace, scope = root / dir_name(key), f"{mode} {key}"
    artifacts = sandbox.resolved_artifacts() / _digest(owner, 16)
    return ToolSite(workspace, scratch, artifacts, owner, scope)


def one_off_site(sandbox: SandboxSettings, run_id: str) -> ToolSite:
    """The site of run `run_id` outside any conversation (`parley chat -m`): the workspace
    root like every such run, a scratch dir per call, and artifacts of its own — the
    empty conversation's would be one directory shared by every one-shot run, each
    reading what the others cut."""
    site = site_for(sandbox, "")
    artifacts = sandbox.resolved_artifacts() / f"run-{_digest(run_id, 16)}"
    return ToolSite(site.workspace, None, artifacts, site.conversation, site.scope)


def describe_places(sandbox: SandboxSettings) -> str:
    """One line for start-up: where tools work and how much they may write."""
    root = sandbox.resolved_workspace()
    where = {
        "channel": f"one per channel under {root}",
        "conversation": f"one per conversation under {root}",
        "shared": f"{root}, shared by every conversation",
    }[sandbox.workspace_scope]

    def cap(n: int) -> str:
        return f"{n / (1 << 20):,.0f} MiB" if n else "no cap"

    return (
        f"workspaces: {where}; writes: {cap(sandbox.max_call_write_bytes)} per call, "
        f"{cap(sandbox.max_conversation_write_bytes)} per conversation"
    )


def prepare_site(site: ToolSite) -> None:
    """Make the site's directories (the workspace for everyone's tools; scratch and
    artifacts private to Parley's user, which the tools' user reaches by capability)."""
    site.workspace.mkdir(parents=True, exist_ok=True)
    site.artifacts.mkdir(mode=0o700, parents=True, exist_ok=True)
    if site.scratch is not None:
        site.scratch.mkdir(mode=0o700, parents=True, exist_ok=True)


__all__ = [
    "CHILD_MARK",
    "ToolSite",
    "describe_places",
    "dir_name",
    "one_off_site",
    "owner_conversation",
    "prepare_site",
    "site_for",
]
