"""Path boundaries for the tools (docs/tools.md): where file tools may read and write, and the
denied paths a `bash` command line names.

Roots and denied paths are resolved once per run's site (`PathRules.of`); each check is
then a string-prefix test on the resolved path, with symlinks followed.
"""

from __future__ import annotations

import errno
import os
import re
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from core.errors import ToolDenied
from core.records import record
from core.sandbox.settings import SandboxSettings
from core.sandbox.site import ToolSite, site_for

_SITES_KEPT = 256  # runs whose rules are kept (a run's are computed at its first file call)


def _expand(path: Path | str, base: Path) -> Path:
    """`~`-expanded absolute path (relative paths hang off `base`), not yet resolved."""
    expanded = Path(os.path.expanduser(path))
    return expanded if expanded.is_absolute() else base / expanded


def _is_under(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def root_prefixes(roots: Iterable[Path]) -> tuple[str, ...]:
    """Each root as a string ending in one "/": `p + "/"` starts with one of them exactly
    when `p` is that root or inside it (one C call per check; pathlib's is ~40× slower)."""
    return tuple(str(root).rstrip("/") + "/" for root in roots)


@record(frozen=True, slots=True)
class PathRules:
    """The file tools' boundaries, resolved once per configuration (docs/tools.md)."""

    workspace: Path
    read_roots: tuple[Path, ...]
    write_roots: tuple[Path, ...]
    # Each denied path as configured, with the forms it is checked in: as written
    # (normalised) and with symlinks resolved.
    denied: tuple[tuple[Path, tuple[Path, ...]], ...]
    # The same as "/"-terminated strings, for the per-call checks (see `root_prefixes`).
    _workspace: str = ""
    _read: tuple[str, ...] = ()
    _write: tuple[str, ...] = ()
    _denied: tuple[str, ...] = ()

    @classmethod
    def of(cls, sandbox: SandboxSettings, site: ToolSite | None = None) -> PathRules:
        """The rules of `sandbox` for the run at `site` (None: a run outside any
        conversation, in the workspace root), computed on first use and kept with the
        settings."""
        if site is None:
            rules = sandbox._cache.get("paths")
            if rules is None:
                rules = sandbox._cache["paths"] = cls._compute(sandbox, site_for(sandbox, ""))
            assert isinstance(rules, PathRules)
            return rules
        sites: OrderedDict[ToolSite, PathRules] = sandbox._cache.setdefault(
            "site-paths", OrderedDict()
        )
        cls.of(sandbox)  # the configuration's rules first: a site's build on them
        found = sites.get(site)
        if found is None:
            found = sites[site] = cls._compute(sandbox, site)
            if len(sites) > _SITES_KEPT:
                sites.popitem(last=False)
        return found

    @classmethod
    def _compute(cls, sandbox: SandboxSettings, site: ToolSite) -> PathRules:
        # Only the run's own places: its workspace (per workspace_scope), its own temp dir
        # (not the temp root, which holds every other run's) and its conversation's
        # artifacts (readable: cut outputs point the model at them), never another's.
        # `allowed_paths` and the denied paths come resolved from the configuration's.
        base = sandbox._cache.get("paths")
        denied_prefixes: tuple[str, ...] | None = None
        if isinstance(base, PathRules):  # shared, not copied: a site's rules are kept per run
            allowed, denied, denied_prefixes = base.write_roots[1:], base.denied, base._denied
        else:  # the configuration's own (site "", no scratch): resolve everything
            root = sandbox.resolved_workspace()
            allowed = tuple(_expand(path, root).resolve() for path in sandbox.allowed_paths)
            forms = ((p, Path(os.path.normpath(_expand(p, root)))) for p in sandbox.denied_paths)
            denied = tuple((path, (written, written.resolve())) for path, written in forms)
        # Parley names and makes the site's directories; only the temp root may be a link.
        scratch = (Path(os.path.realpath(site.scratch)),) if site.scratch else ()
        write_roots = (site.workspace, *scratch, *allowed)
        read_roots = (*write_roots, site.artifacts)
        return cls(
            site.workspace,
            read_roots,
            write_roots,
            denied,
            str(site.workspace),
            root_prefixes(read_roots),
            root_prefixes(write_roots),
            (
                denied_prefixes
                if denied_prefixes is not None
                else root_prefixes(form for _, forms in denied for form in forms)
            ),
        )


def allowed_roots(
    sandbox: SandboxSettings, *, for_write: bool, site: ToolSite | None = None
) -> list[Path]:
    """The resolved roots a file tool may use. Artifacts are readable, never writable."""
    rules = PathRules.of(sandbox, site)
    return list(rules.write_roots if for_write else rules.read_roots)


def resolve_path(
    path: str,
    sandbox: SandboxSettings,
    *,
    for_write: bool,
    site: ToolSite | None = None,
    readable: tuple[str, ...] = (),
) -> Path:
    """Resolve `path` to an absolute, symlink-free path inside the roots of the run at
    `site` (see `PathRules.of`). A seatbelt: the file tools' wall is the kernel
    (core/sandbox/filejail.py); this gives the model a clear reason first.

    Relative paths are relative to the workspace. Denied paths beat allowed roots and are
    matched both as written and resolved, so a symlink cannot reach them either.
    `readable`: read-only roots of Parley's own beyond the run's (the skill folders, as
    `root_prefixes` writes them), for reading only.

    Raises:
        ToolDenied: the path is outside every allowed root or inside a denied path.
    """
    rules = PathRules.of(sandbox, site)
    lexical = os.path.normpath(os.path.join(rules._workspace, os.path.expanduser(path)))
    try:
        resolved = _kernel_realpath(lexical)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink loop
            raise ToolDenied(f"permission denied: cannot resolve `{path}`: {exc}") from exc
        # Non-strict realpath follows every existing symlink (dangling ones included) and
        # keeps the not-yet-existing tail, so a file about to be written is checked too.
        resolved = os.path.realpath(lexical)
    probe, lexical_probe = resolved.rstrip("/") + "/", lexical.rstrip("/") + "/"
    if probe.startswith(rules._denied) or lexical_probe.startswith(rules._denied):
        denied = next(  # which one, for the message
            name
            for name, forms in rules.denied
            if any(p.startswith(root_prefixes(forms)) for p in (probe, lexical_probe))
        )
        raise ToolDenied(
            f"permission denied: `{path}` resolves to {resolved}, which is inside "
            f"the denied path {denied}"
        )
    roots = rules._write if for_write else rules._read + readable
    if not probe.startswith(roots):
        names = ", ".join(root.rstrip("/") or "/" for root in roots)
        raise ToolDenied(
            f"permission denied: `{path}` resolves to {resolved}, which is outside the "
            f"allowed roots ({names})"
        )
    return Path(resolved)


def _kernel_realpath(path: str) -> str:
    """`os.path.realpath(path, strict=True)` as the kernel resolves it: the path opened
    with O_PATH (symlinks followed; nothing is read) and its name read back from
    /proc/self/fd: three system calls, where realpath makes one `lstat` per component in
    Python (a third of a `read_file` call, docs/benchmarks.md). Realpath's own answer when
    /proc is not there, or the file was unlinked since it was opened ("… (deleted)").

    Raises:
        OSError: as `os.open` (ENOENT, ELOOP, ENOTDIR, EACCES).
    """
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        named = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        named = ""
    finally:
        os.close(fd)
    if named.startswith("/") and not named.endswith(" (deleted)"):
        return named
    return os.path.realpath(path, strict=True)


# Path-looking substrings of a command line: absolute, home- or workspace-relative.
_PATHISH = re.compile(r"(?:~|\$\{?HOME\}?|[\w.-]+)?/[^\s'\"`;|&()<>=]*|~(?=[\s'\"]|$)")


def mentions_denied_path(
    command: str, sandbox: SandboxSettings, site: ToolSite | None = None
) -> Path | None:
    """The first denied path a shell command line names, if any: a seatbelt for `bash`
    (the kernel sandbox is the wall; this only catches the obvious spelling early)."""
    rules = PathRules.of(sandbox, site)
    home = os.path.expanduser("~")
    for match in _PATHISH.finditer(command):
        text = re.sub(r"^(~|\$\{?HOME\}?)", lambda _: home, match.group())
        candidate = Path(os.path.normpath(rules.workspace / text))  # absolute `text` wins
        for _, forms in rules.denied:
            if any(_is_under(candidate, form) for form in forms):
                return forms[0]
    return None
