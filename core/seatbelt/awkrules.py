"""awk for the `bash` blocklist: where an awk command's program comes from, and whether it
runs other programs.

awk runs commands with `system()`, with a pipe (`print … | cmd`, `cmd | getline`, the
coprocess `|&`), and — in gawk — with an indirect call (`f = "system"; @f("…")`), which
names the function in a string no text check can follow; gawk also loads native code
(`-l lib`, `@load "lib"`). So a program with any of these needs an approver. The program is
read as awk reads it: strings, regular expressions and comments are data, so
`/foo|bar/` and `"a|b"` are not pipes. Options are read as gawk reads them (clusters,
attached values, unique prefixes of long options, `-W name`); every `-e`/`--source` text is
a program, and an option Parley does not know fails closed. A program file (`-f`, `-E`,
`-i`, `@include`) runs whatever it holds, like `python3 script.py`.
"""

from __future__ import annotations

import re
from dataclasses import field

from core.records import record
from core.seatbelt.shellexpand import Word
from core.seatbelt.verdicts import OK, BlockVerdict, unreadable, worst

# gawk's long options (5.x) and the short letter each stands for ("" = no short form);
# mawk's `-W exec` is gawk's `--exec`.
_WITH_VALUE = {
    "assign": "v", "exec": "E", "field-separator": "F", "file": "f", "include": "i",
    "load": "l", "source": "e",
}  # fmt: skip
_OPTIONAL_VALUE = frozenset({"debug", "dump-variables", "lint", "pretty-print", "profile"})
_NO_VALUE = frozenset(
    {"bignum", "characters-as-bytes", "copyleft", "copyright", "csv", "gen-pot", "help",
     "lint-old", "no-optimize", "non-decimal-data", "nostalgia", "optimize", "parsedebug",
     "persist", "posix", "re-interval", "sandbox", "traditional", "trace", "use-lc-numeric",
     "version",
     # mawk's `-W` names (their values attached: `-W sprintf=2048`)
     "dump", "interactive", "posix_space", "random", "repetitions", "sprintf", "usage"}
)  # fmt: skip
_LONG = (*_WITH_VALUE, *_OPTIONAL_VALUE, *_NO_VALUE)
_SHORT_WITH_VALUE = "eEfFilvW"
_SHORT_OPTIONAL_VALUE = "dDLop"  # the value only attached: `-dvars.txt`
_SHORT_NO_VALUE = "bcCghIkMNnOPrsStV"
# gawk's own extensions (in its AWKLIBPATH); `fork` is left out: a loop of forks is a bomb.
SAFE_EXTENSIONS = frozenset(
    {"filefuncs", "fnmatch", "inplace", "intdiv", "ordchr", "readdir", "readfile",
     "revoutput", "revtwoway", "rwarray", "time"}
)  # fmt: skip
# After one of these (or at the start) a `/` opens a regular expression, not a division.
_REGEX_AFTER_WORDS = frozenset({"print", "printf", "return", "case", "do", "else"})
_OPERAND_END = re.compile(r"[\w)\]$.\"]")
_DIRECTIVE = re.compile(r"@\s*(include|namespace|load)\b")
_TYPED_REGEX = re.compile(r"@\s*//")  # gawk's `@/re/`, blanked
_SYSTEM = re.compile(r"\bsystem\s*\(")
_PIPE = re.compile(r"(?<!\|)\|(?!\|)")


@record(slots=True)
class AwkArgs:
    """What an awk command line runs: inline programs, program files, extensions."""

    programs: list[Word] = field(default_factory=list)  # the operand, or every `-e`
    files: list[Word] = field(default_factory=list)  # `-f`, `-E`, `-i` values
    extensions: list[Word] = field(default_factory=list)  # `-l` values
    unknown: str = ""  # an option Parley does not know


def awk_args(args: list[Word]) -> AwkArgs:
    """Read awk's arguments as gawk (and mawk, POSIX awk) does."""
    found, i = AwkArgs(), 0
    sources: list[Word] = []
    while i < len(args):
        arg = args[i].text
        following = args[i + 1] if i + 1 < len(args) else None
        if arg == "--":
            i += 1
            break
        if arg == "-" or not arg.startswith("-"):
            break
        if arg.startswith("--"):
            letter, value, used_next = _long_option(arg[2:], args[i], following, found)
            i += 1 + used_next
        else:
            letter, value, used_next = _short_cluster(arg, args[i], following, found)
            i += 1 + used_next
            if letter == "W" and value is not None:  # `-W source=…`: gawk's `--source=…`
                following = args[i] if i < len(args) else None
                letter, value, used_next = _long_option(value.text, value, following, found)
                i += used_next
        if letter == "e" and value is not None:
            sources.append(value)
        elif letter in "fE" and value is not None:
            found.files.append(value)
            if letter == "E":  # gawk reads no options after `-E`
                break
        elif letter == "i" and value is not None:
            found.files.append(value)
        elif letter == "l" and value is not None:
            found.extensions.append(value)
    if sources:
        found.programs = sources
    elif not found.files and i < len(args):
        found.programs = [args[i]]
    return found


def awk_text(program: str) -> AwkArgs:
    """An `AwkArgs` of one known inline program (read from stdin or a heredoc)."""
    return AwkArgs(programs=[Word(program)])


def _long_option(
    spelled: str, word: Word, following: Word | None, found: AwkArgs
) -> tuple[str, Word | None, bool]:
    """(short letter, value, whether the value was the next word) of `--name[=value]`."""
    key, eq, _ = spelled.partition("=")
    matches = [name for name in _LONG if name.startswith(key)] if key else []
    name = key if key in _LONG else (matches[0] if len(matches) == 1 else "")
    if not name:
        found.unknown = found.unknown or f"--{key}"
        return "", None, False
    if name not in _WITH_VALUE:
        return "", None, False
    if eq:
        return _WITH_VALUE[name], _part(word, word.text.index("=") + 1), False
    return _WITH_VALUE[name], following, following is not None


def _short_cluster(
    arg: str, word: Word, following: Word | None, found: AwkArgs
) -> tuple[str, Word | None, bool]:
    """(letter, value, whether the value was the next word) of a cluster such as `-bve x`:
    the first letter that takes a value ends it."""
    for at, letter in enumerate(arg[1:], 1):
        if letter in _SHORT_WITH_VALUE:
            if at + 1 < len(arg):
                return letter, _part(word, at + 1), False
            return letter, following, following is not None
        if letter in _SHORT_OPTIONAL_VALUE:
            return "", None, False
        if letter not in _SHORT_NO_VALUE:
            found.unknown = found.unknown or f"-{letter}"
            return "", None, False
    return "", None, False


def _part(word: Word, start: int) -> Word:
    """The value attached to an option word (`-e'…'`, `--source=…`), as a word."""
    return Word(word.text[start:], word.dynamic, word.known, word.substituted)


def awk_verdict(name: str, found: AwkArgs) -> BlockVerdict:
    """The verdict on what `found` runs (program files are judged by the caller: they
    may be stdin)."""
    verdicts = []
    if found.unknown:
        verdicts.append(unreadable(f"`{name} {found.unknown}` is an option Parley does not know"))
    for extension in found.extensions:
        verdicts.append(_extension(name, extension.text, extension.dynamic))
    for program in found.programs:
        if program.dynamic:
            verdicts.append(unreadable(f"the `{name}` program is computed at run time"))
            continue
        why = program_runs(program.text)
        if why:
            verdicts.append(unreadable(f"the `{name}` program {why}"))
        for library in loaded(program.text):
            verdicts.append(_extension(name, library, ""))
    return worst(verdicts)


def _extension(name: str, library: str, dynamic: str) -> BlockVerdict:
    base = library.removesuffix(".so")
    if dynamic or "/" in library or base not in SAFE_EXTENSIONS:
        return unreadable(f"`{name}` loads the extension `{library}` (native code)")
    return OK


def program_runs(program: str) -> str:
    """How the awk `program` runs other programs ("" if it does not, as far as its text
    shows)."""
    code = _code(program)
    if code is None:
        return "cannot be read (an unterminated string or regular expression)"
    if _SYSTEM.search(code):
        return "runs commands (`system()`)"
    if "|&" in code:
        return "runs a command as a coprocess (`|&`)"
    if _PIPE.search(code):
        return "runs commands (a pipe to or from a command)"
    for at in re.finditer("@", code):
        if not (_DIRECTIVE.match(code, at.start()) or _TYPED_REGEX.match(code, at.start())):
            return "calls a function named at run time (`@name(…)`), which may be `system`"
    return ""


def loaded(program: str) -> list[str]:
    """The libraries the awk `program` loads with `@load "…"`."""
    return re.findall(r'@\s*load\s*"((?:\\.|[^"\\])*)"', program)


def _code(program: str) -> str | None:
    """`program` with strings, regular expressions and comments blanked (`""`, `//`), so
    what is left is code; None if a string or regular expression never ends."""
    out: list[str] = []
    i, n = 0, len(program)
    while i < n:
        char = program[i]
        if char == "#":
            end = program.find("\n", i)
            i = n if end < 0 else end
        elif char == '"':
            end = _string_end(program, i)
            if end < 0:
                return None
            out.append('""')
            i = end + 1
        elif char == "/" and _regex_may_start(out):
            end = _regex_end(program, i)
            if end < 0:
                return None
            out.append("//")
            i = end + 1
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    """The closing `"` of the string opened at `start` (awk ends none at a raw newline:
    that is a syntax error, so -1, as for no end)."""
    i = start + 1
    while i < len(text) and text[i] != "\n":
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    return -1


def _regex_end(text: str, start: int) -> int:
    """The closing `/` of the regular expression opened at `start` (a `/` inside a
    bracket expression does not close it)."""
    i, bracket = start + 1, False
    while i < len(text) and text[i] != "\n":
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if bracket:
            if char == "]" and text[i - 1] not in "[^":
                bracket = False
        elif char == "[":
            bracket = True
        elif char == "/":
            return i
        i += 1
    return -1


def _regex_may_start(out: list[str]) -> bool:
    """A `/` here opens a regular expression: nothing that ends an operand precedes it
    (or only a keyword such as `print`), or it follows gawk's `@` (`@/re/`)."""
    before = "".join(out[-40:]).rstrip(" \t")
    if not before or before.endswith("@"):
        return True
    if before.endswith(("++", "--")):  # `i++ / 2`
        return False
    word = re.search(r"[A-Za-z_]\w*$", before)
    if word and word.group() in _REGEX_AFTER_WORDS:
        return True
    return _OPERAND_END.fullmatch(before[-1]) is None
