"""The wall: everything that confines a tool's process or file access, by the kernel.

What it promises (docs/guide/safety.md, docs/tools.md):
- a tool process writes only beneath its run's workspace, `allowed_paths` and its own
  scratch dir, reads only those, the system dirs and its conversation's artifacts, and
  never Parley's configuration, store, `$HOME` or `/proc` (Landlock);
- it opens only the sockets its network mode allows, to the addresses it allows (seccomp
  and the supervisor), and reaches no namespace, keyring, `bpf` or mount (the kernel
  surface);
- no process, shared memory segment or message queue it makes outlives its call or is
  seen by another (a PID and an IPC namespace per call, the reaper, the ledger);
- its CPU, memory, files, processes and writes are capped; the file tools get the same
  rules on a confined thread.

This module is its whole API; the modules beside it are its own. Names load at first
use: a turn that spawns nothing loads none of the wall.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.sandbox.filejail import FileJail, file_jail, release
    from core.sandbox.gitenv import neutralised
    from core.sandbox.jail import SYSTEM_ROOTS, Jail, Spawn
    from core.sandbox.landlock import abi_version, make_undumpable
    from core.sandbox.outputcap import CappedStream, cap_output
    from core.sandbox.paths import PathRules, mentions_denied_path, resolve_path
    from core.sandbox.process import ProcessResult, run_process
    from core.sandbox.quota import budget, call_quota, refuse_write, tree_bytes, usage_of
    from core.sandbox.reaper import REAPER, kill_leftovers
    from core.sandbox.roots import config_entries, make_root
    from core.sandbox.seccomp import open_no_symlinks
    from core.sandbox.settings import SandboxSettings, default_temp_root
    from core.sandbox.site import ToolSite, describe_places, one_off_site, prepare_site, site_for
    from core.sandbox.webnet import Fetched, Fetcher

_WHERE = {
    # the configuration
    "SandboxSettings": "settings",
    "default_temp_root": "settings",
    # where a run works: its workspace, scratch dir and artifacts
    "ToolSite": "site",
    "site_for": "site",
    "prepare_site": "site",
    "one_off_site": "site",
    "describe_places": "site",
    # confined processes
    "Jail": "jail",
    "Spawn": "jail",
    "SYSTEM_ROOTS": "jail",
    "run_process": "process",
    "ProcessResult": "process",
    "neutralised": "gitenv",
    "REAPER": "reaper",
    "kill_leftovers": "reaper",
    "cap_output": "outputcap",
    "CappedStream": "outputcap",
    # confined file access
    "FileJail": "filejail",
    "file_jail": "filejail",
    "release": "filejail",
    "PathRules": "paths",
    "resolve_path": "paths",
    "mentions_denied_path": "paths",
    "open_no_symlinks": "seccomp",
    "make_root": "roots",
    "config_entries": "roots",
    # write quotas
    "budget": "quota",
    "call_quota": "quota",
    "refuse_write": "quota",
    "tree_bytes": "quota",
    "usage_of": "quota",
    # Parley's own process, the kernel's offer
    "make_undumpable": "landlock",
    "abi_version": "landlock",
    # web_fetch's network wall (Parley fetches for the tool)
    "Fetcher": "webnet",
    "Fetched": "webnet",
}
__all__ = [
    "REAPER",
    "SYSTEM_ROOTS",
    "CappedStream",
    "Fetched",
    "Fetcher",
    "FileJail",
    "Jail",
    "PathRules",
    "ProcessResult",
    "SandboxSettings",
    "Spawn",
    "ToolSite",
    "abi_version",
    "budget",
    "call_quota",
    "cap_output",
    "config_entries",
    "default_temp_root",
    "describe_places",
    "file_jail",
    "kill_leftovers",
    "make_root",
    "make_undumpable",
    "mentions_denied_path",
    "neutralised",
    "one_off_site",
    "open_no_symlinks",
    "prepare_site",
    "refuse_write",
    "release",
    "resolve_path",
    "run_process",
    "site_for",
    "tree_bytes",
    "usage_of",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
