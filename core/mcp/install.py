"""What a stdio server's `command` needs to read beyond its own files: the interpreter and
the installation it resolves to (docs/guide/extending.md, MCP servers).

A server installed in a virtualenv or an npm folder runs a program that lives outside
the system dirs (`.venv/bin/python` → the base interpreter under `~/.pyenv/…`, a
`node_modules/.bin` link → the package's script → `node`). The sandbox reads nothing it
is not told to, so each of these is found here, read-only, from the command alone:

- the program, found on the server's `PATH` as its init's `exec` finds it, and every
  link on the way to the real file;
- a virtualenv any of them lies in (the folder holding `pyvenv.cfg`), and the base
  Python its `home` names;
- the installation of a real program in a `bin` folder (its `lib` beside it: a Python's
  standard library and site-packages, a Node's global `node_modules` with npm);
- the interpreter a script's `#!` line names (`#!/usr/bin/env node` looks on `PATH`);
- for a Node script (a `.js` file, or anything in a `node_modules`), its package
  folder: the outermost `node_modules` it lies in, else the nearest folder with a
  `package.json`.

Nothing is added beneath the system dirs (readable already) and nothing that is not
there. `npx` and `uvx` fetch their package into a cache: `cache_env` points it at the
server's own directory, so a package is fetched once, not at every start.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

_DEPTH = 4  # interpreters of interpreters (a script whose #! names another script…)
_SHEBANG_BYTES = 256
_NODE_SUFFIXES = (".js", ".mjs", ".cjs")
_VENV_LEVELS = 3  # .venv/bin/python: pyvenv.cfg is two levels up; leave room for one more


def program_path(program: str, path: str, cwd: Path) -> Path | None:
    """Where `program` is: a path with a `/` (relative: to `cwd`), else the first match
    on `path`; None when it is not there."""
    if "/" in program:
        found = Path(os.path.expanduser(program))
        found = found if found.is_absolute() else cwd / found
        return found if found.exists() else None
    hit = shutil.which(program, path=path)
    return Path(hit) if hit is not None else None


def installation(
    argv: Sequence[str], *, path: str, cwd: Path, system: Iterable[str | Path] = ()
) -> list[Path]:
    """The files and folders the server started by `argv` reads to run, outside the
    `system` roots (see the module docstring); `path` is its `PATH`, `cwd` where a
    relative path in `argv` is taken from."""
    roots = [Path(p) for p in system]
    found: list[Path] = []
    program = program_path(argv[0], path, cwd) if argv else None
    if program is not None:
        _program(program, path, found, _DEPTH)
    for item in argv[1:]:
        if item.startswith("-"):
            continue
        script = Path(os.path.expanduser(item))
        script = script if script.is_absolute() else cwd / script
        if script.is_file():
            _places_of(script.resolve(), found)
    kept: list[Path] = []
    for place in found:
        if place.exists() and place not in kept and not any(_under(place, r) for r in roots):
            kept.append(place)
    return kept


def cache_env(argv: Sequence[str], own: Path) -> dict[str, str]:
    """Variables that keep `npx` / `uvx` package caches in `own` (the server's own
    directory) instead of its temp `HOME`, which is new at every start."""
    name = Path(argv[0]).name if argv else ""
    cache = own / ".cache"
    if name == "npx":
        return {"npm_config_cache": str(cache / "npm"), "npm_config_update_notifier": "false"}
    if name in ("uvx", "uv"):
        return {"UV_CACHE_DIR": str(cache / "uv"), "UV_PYTHON_INSTALL_DIR": str(cache / "python")}
    return {}


def _program(program: Path, path: str, found: list[Path], depth: int) -> None:
    """`program`, the links to its real file, their installations, and its interpreter."""
    chain = _links(program)
    found += chain
    for hop in chain:
        _places_of(hop, found)
    real = chain[-1]
    interpreter = _interpreter(real, path)
    if interpreter is None and real.parent.name == "bin":
        found.append(real.parent.parent / "lib")  # a binary's installation: its libraries
    if interpreter is not None and depth > 0:
        _program(interpreter, path, found, depth - 1)


def _links(path: Path) -> list[Path]:
    """`path` and each link it goes through, ending with the real file."""
    hops = [path]
    for _ in range(40):  # the kernel's own limit on links in a row
        current = hops[-1]
        if not current.is_symlink():
            break
        hops.append(current.parent / os.readlink(current))
    hops.append(path.resolve())
    return [Path(os.path.normpath(h)) for h in hops]


def _places_of(file: Path, found: list[Path]) -> None:
    """The virtualenv (and its base Python) or Node package `file` belongs to."""
    venv = _venv_root(file)
    if venv is not None:
        found.append(venv)
        home = _base_home(venv)
        if home is not None:
            found.append(home.parent / "lib" if home.name == "bin" else home)
    if file.suffix in _NODE_SUFFIXES or "node_modules" in file.parts:
        package = _node_package(file)
        if package is not None:
            found.append(package)


def _venv_root(file: Path) -> Path | None:
    for folder in list(file.parents)[:_VENV_LEVELS]:
        if (folder / "pyvenv.cfg").is_file():
            return folder
    return None


def _base_home(venv: Path) -> Path | None:
    """The `home` (the base interpreter's folder) a virtualenv's pyvenv.cfg names."""
    try:
        text = (venv / "pyvenv.cfg").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve()
    return None


def _node_package(file: Path) -> Path | None:
    parts = file.parts
    if "node_modules" in parts:  # hoisted dependencies sit in the outermost one
        return Path(*parts[: parts.index("node_modules") + 1])
    for folder in file.parents:
        if folder in (Path("/"), Path.home()):
            return None  # a package.json here names no package folder worth granting
        if (folder / "package.json").is_file():
            return folder
    return None


def _interpreter(real: Path, path: str) -> Path | None:
    """The program a script's `#!` line runs (`env NAME` looked up on `path`)."""
    try:
        with real.open("rb") as f:
            head = f.read(_SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        return program_path(names[0], path, Path("/")) if names else None
    return Path(words[0]) if Path(words[0]).is_absolute() else None


def _under(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


__all__ = ["cache_env", "installation", "program_path"]
