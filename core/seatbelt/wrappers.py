"""Programs that run another command, for the `bash` blocklist: how each takes its own
options, so the command it runs is found and judged (`nice -n 5 rm -rf x`, `chrt 10 rm …`,
`flock /tmp/l -c 'rm …'`).

Every wrapper's options are listed here; an option that is not is a reason to ask an
approver (`unwrap` reports it), because guessing whether it takes a value could make the
value look like the command, or the command look like a value. Options end at the first
word that is not one (these programs all stop there, like `getopt` with `+`).
"""

from __future__ import annotations

import re
from dataclasses import field

from core.records import record
from core.seatbelt.shellexpand import Word

ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# GNU parallel's replacement strings: `{}`, `{.}`, `{/}`, `{//}`, `{/.}`, `{#}`, `{%}`, `{3}`.
PARALLEL_REPLACEMENT = re.compile(r"\{(\d*|\.|/|//|/\.|#|%)\}")


@record(frozen=True, slots=True)
class Wrapper:
    """How one wrapper takes its options before the command it runs."""

    flags: str = ""  # short options without a value
    values: str = ""  # short options with a value: attached (`-n5`) or the next word
    attached: str = ""  # short options whose value, if any, is attached only (`-n1024`)
    long_flags: frozenset[str] = frozenset()
    long_values: frozenset[str] = frozenset()  # `--opt=v` or `--opt v`
    long_attached: frozenset[str] = frozenset()  # `--opt` or `--opt=v`, never `--opt v`
    operands: int = 0  # words between the options and the command (`timeout 5`, `chrt 10`)
    no_command: frozenset[str] = frozenset()  # options after which no command follows
    any_long_with_value: bool = False  # `--key=value` options not listed are fine (valgrind)
    numeric: bool = False  # `nice -5`: a bare number is an option
    leading: int = 0  # words before the options (`setarch ARCH [options] cmd`)


def _w(*, flags: str = "", values: str = "", attached: str = "", longs: str = "",
       long_values: str = "", long_attached: str = "", operands: int = 0, no_command: str = "",
       any_long_with_value: bool = False, numeric: bool = False,
       leading: int = 0) -> Wrapper:  # fmt: skip
    return Wrapper(
        flags,
        values,
        attached,
        frozenset(longs.split()),
        frozenset(long_values.split()),
        frozenset(long_attached.split()),
        operands,
        frozenset(no_command.split()),
        any_long_with_value,
        numeric,
        leading,
    )


WRAPPERS: dict[str, Wrapper] = {
    "nohup": _w(),
    "builtin": _w(),
    "coproc": _w(),
    "eatmydata": _w(),
    "catchsegv": _w(),
    "nocache": _w(),
    "exec": _w(flags="cl", values="a"),
    "command": _w(flags="pvV", no_command="-v -V"),
    "time": _w(
        flags="pavq",
        values="fo",
        longs="--portability --append --verbose --quiet",
        long_values="--format --output",
    ),
    "nice": _w(values="n", long_values="--adjustment", numeric=True),
    "ionice": _w(
        flags="t",
        values="cnpPu",
        longs="--ignore",
        long_values="--class --classdata --pid --pgid --uid",
        no_command="-p -P -u --pid --pgid --uid",
    ),
    "setsid": _w(flags="cfw", longs="--ctty --fork --wait"),
    "stdbuf": _w(values="ioe", long_values="--input --output --error"),
    "timeout": _w(
        flags="v",
        values="sk",
        longs="--preserve-status --foreground --verbose",
        long_values="--signal --kill-after",
        operands=1,
    ),
    "env": _w(
        flags="i0v",
        values="uCS",
        longs="--ignore-environment --null --debug --list-signal-handling",
        long_values="--unset --chdir --split-string",
        long_attached="--default-signal --ignore-signal --block-signal",
    ),
    "chrt": _w(
        flags="abdefimoprRv",
        values="TPD",
        longs="--all-tasks --batch --deadline --fifo --idle --max --other --pid --rr "
        "--reset-on-fork --verbose",
        long_values="--sched-runtime --sched-period --sched-deadline",
        operands=1,
        no_command="-p -m --pid --max",
    ),
    "taskset": _w(
        flags="acp", longs="--all-tasks --cpu-list --pid", operands=1, no_command="-p --pid"
    ),
    "flock": _w(
        flags="sexnuoFv",
        values="wE",
        longs="--shared --exclusive --nonblock --nb --unlock --close --no-fork --verbose",
        long_values="--timeout --wait --conflict-exit-code",
        operands=1,
    ),
    "prlimit": _w(
        values="po",
        attached="cdefilmnqrstuvxy",
        longs="--noheadings --raw --verbose",
        long_values="--pid --output",
        long_attached="--core --data --nice --fsize --sigpending --memlock --rss --nofile "
        "--msgqueue --rtprio --stack --cpu --nproc --as --locks --rttime",
    ),
    "unshare": _w(
        flags="fmuinpCTUrc",
        values="RwSG",
        longs="--fork --map-root-user --map-current-user --map-auto --keep-caps",
        long_values="--propagation --setgroups --map-user --map-group --map-users "
        "--map-groups --root --wd --setuid --setgid --monotonic --boottime --load-interp",
        long_attached="--mount --uts --ipc --net --pid --user --cgroup --time --mount-proc "
        "--kill-child --mount-binfmt",
    ),
    "setpriv": _w(
        flags="d",
        longs="--dump --nnp --no-new-privs --clear-groups --keep-groups --init-groups --reset-env",
        long_values="--inh-caps --ambient-caps --bounding-set --ruid --euid --rgid --egid "
        "--reuid --regid --groups --securebits --pdeathsig --selinux-label "
        "--apparmor-profile --landlock-access --landlock-rule",
        no_command="-d --dump",
    ),
    "xargs": _w(
        flags="0rtpxo",
        values="adEILnPs",
        attached="eil",
        longs="--null --no-run-if-empty --verbose --interactive --exit --open-tty",
        long_values="--arg-file --delimiter --max-args --max-procs --max-chars --process-slot-var",
        long_attached="--eof --replace --max-lines",
    ),
    "watch": _w(
        flags="gtbecCwxpr",
        values="nq",
        attached="d",
        longs="--chgexit --no-title --beep --errexit --color --no-color --no-wrap --exec "
        "--precise --no-rerun",
        long_values="--interval --equexit",
        long_attached="--differences",
    ),
    "busybox": _w(longs="--list --list-full --install", no_command="--list --list-full"),
    "fakeroot": _w(flags="u", values="lsi", longs="--unknown-is-real", long_values="--lib --faked"),
    "unbuffer": _w(flags="p"),
    "strace": _w(
        flags="fFcCdDhiknNqrtTvVwxyzZ",
        values="abeEIoOpPsSuUX",
        any_long_with_value=True,
        no_command="-p",
    ),
    "ltrace": _w(flags="bcCfhiLrStTV", values="aAeEFlnopsuwxD", no_command="-p"),
    "valgrind": _w(flags="qvsh", any_long_with_value=True),
    "chroot": _w(longs="--skip-chdir", long_values="--userspec --groups", operands=1),
    "ssh-agent": _w(flags="cdDsk", values="aEOPt"),
    "dbus-run-session": _w(long_values="--config-file --dbus-daemon"),
    "setarch": _w(
        flags="RFZLXBITS3v",
        longs="--uname-2.6 --addr-no-randomize --fdpic-funcptrs --mmap-page-zero "
        "--addr-compat-layout --read-implies-exec --32bit --short-inode --whole-seconds "
        "--sticky-timeouts --3gb --4gb --verbose",
        leading=1,
    ),
}
WRAPPERS["linux32"] = WRAPPERS["linux64"] = WRAPPERS["i386"] = WRAPPERS["x86_64"] = Wrapper(
    WRAPPERS["setarch"].flags, long_flags=WRAPPERS["setarch"].long_flags
)


@record(slots=True)
class Unwrapped:
    """What a wrapper runs: an argv, or shell text (`flock f -c '…'`, `watch 'a | b'`)."""

    argv: list[Word] = field(default_factory=list)
    shell: Word | None = None
    problem: str = ""  # an option Parley does not know: the command cannot be found safely
    assignments: list[str] = field(default_factory=list)  # `env A=1 cmd`
    split: bool = False  # `env -S`: env splits a string of its own into the command


def unwrap(name: str, args: list[Word]) -> Unwrapped:
    """What wrapper `name` runs, given its arguments."""
    if name == "parallel":
        return _parallel(args)
    if name == "capsh":  # `capsh [--opt…] -- ARGS` runs `bash ARGS`
        rest = next((args[i + 1 :] for i, a in enumerate(args) if a.text == "--"), None)
        return Unwrapped(argv=[] if rest is None else [Word("bash"), *rest])
    spec = WRAPPERS[name]
    out = Unwrapped()
    args = args[spec.leading :]
    i, ended = _options(name, spec, args, out)
    if out.split or out.problem:
        return out
    if name == "env":
        while i < len(args) and ASSIGNMENT.match(args[i].text):
            out.assignments.append(args[i].text)
            i += 1
    rest = args[i:]
    if ended:
        return out
    if name == "flock" and len(rest) > spec.operands and rest[1].text in {"-c", "--command"}:
        out.shell = rest[2] if len(rest) > 2 else Word("")
        return out
    rest = rest[spec.operands :]
    if name == "coproc":  # `coproc NAME { cmd; }`: tree-sitter leaves these as plain words
        rest = rest[1:] if len(rest) > 1 and rest[1].text == "{" else rest
        rest = rest[1:] if rest and rest[0].text == "{" else rest
    if name == "watch" and rest and not any(a.text in {"-x", "--exec"} for a in args[:i]):
        joined = " ".join(w.text for w in rest)
        out.shell = Word(joined, "; ".join(w.dynamic for w in rest if w.dynamic))
        return out
    out.argv = xargs_input(rest, _xargs_replace(args[:i])) if name == "xargs" else rest
    return out


def _options(name: str, spec: Wrapper, args: list[Word], out: Unwrapped) -> tuple[int, bool]:
    """Skip the wrapper's options; (index of the first other word, no command follows)."""
    i, ended = 0, False
    while i < len(args):
        word = args[i].text
        if word == "--":
            return i + 1, ended
        if not word.startswith("-") or word == "-":
            if name == "env" and word == "-":  # `env -` is `env -i`
                i += 1
                continue
            break
        if name == "env" and re.match(r"-S|--split-string", word):
            _split_string(args, i, out)
            return i, True
        letters = [] if word.startswith("--") else [f"-{c}" for c in word[1:]]
        ended |= bool({word.partition("=")[0], *letters} & spec.no_command)
        step = _long(spec, word) if word.startswith("--") else _short(spec, word)
        if step is None:
            out.problem = f"`{name}` is given the option `{word}`, which Parley does not know"
            return i, True
        i += step
    return i, ended


def _long(spec: Wrapper, word: str) -> int | None:
    key, eq, _ = word.partition("=")
    if spec.numeric and re.fullmatch(r"--?\d+", word):
        return 1
    if key in spec.long_values:
        return 1 if eq else 2
    if (key in spec.long_flags and not eq) or key in spec.long_attached:
        return 1
    return 1 if spec.any_long_with_value and eq else None


def _short(spec: Wrapper, word: str) -> int | None:
    if spec.numeric and re.fullmatch(r"-\d+", word):
        return 1
    for j, letter in enumerate(word[1:], 1):
        if letter in spec.values:
            return 2 if j == len(word) - 1 else 1
        if letter in spec.attached:
            return 1
        if letter not in spec.flags:
            return None
    return 1


def _split_string(args: list[Word], i: int, out: Unwrapped) -> None:
    """`env -S "cmd args"`: env splits the string itself (quotes and `${VAR}` included)."""
    word = args[i].text
    attached = word[2:] if word.startswith("-S") else word.partition("=")[2]
    split = Word(attached, args[i].dynamic, args[i].known) if attached else None
    split = split or (args[i + 1] if i + 1 < len(args) else Word(""))
    pieces = [Word(p, split.dynamic, split.known) for p in split.text.split()]
    out.argv = pieces + args[i + (1 if attached else 2) :]
    out.split = True


def _xargs_replace(options: list[Word]) -> str | None:
    replace = None
    for i, option in enumerate(options):
        arg = option.text
        if arg == "-I":
            replace = options[i + 1].text if i + 1 < len(options) else "{}"
        elif re.fullmatch(r"-[Ii].+", arg):
            replace = arg[2:]
        elif arg in {"-i", "--replace"}:
            replace = "{}"
        elif arg.startswith("--replace="):
            replace = arg.split("=", 1)[1]
    return replace


def xargs_input(argv: list[Word], replace: str | None) -> list[Word]:
    """xargs adds words read from stdin: to the end, or in place of the -I string."""
    argv = argv or [Word("echo")]
    read = "words read by xargs"
    if replace is None:
        return [*argv, Word("", read, known=False, substituted=True)]
    return [
        Word(w.text, read, known=False, substituted=True) if replace in w.text else w for w in argv
    ]


_PARALLEL_VALUES = frozenset(
    str.split(
        "-j --jobs -P -S --sshlogin -a --arg-file -d --delimiter -E -I -N -n --max-args -L "
        "--max-lines -s --max-chars -C --colsep --joblog --results --res --tmpdir --workdir --wd "
        "--env --timeout --retries --delay --tag-string --tagstring --sshloginfile --slf "
        "--basefile --bf --return --transferfile --tf --memfree --load --nice --halt --block "
        "--blocksize --header --sshdelay --progress-bar --eta-format"
    )
)
_PARALLEL_FLAGS = frozenset(
    str.split(
        "-0 --null -k --keep-order -q --quote -v --verbose -t --tag --line-buffer "
        "--lb --group --ungroup -u --pipe --spreadstdin --dry-run --dryrun --bar --eta "
        "--progress --no-notice --will-cite -X -m --xargs -r --no-run-if-empty --files "
        "--halt-on-error --plain --trim --shuf --linebuffer"
    )
)


def _parallel(args: list[Word]) -> Unwrapped:
    """GNU parallel joins its command words and runs them with a shell, once per input."""
    i = 0
    while i < len(args) and args[i].text.startswith("-") and args[i].text != "--":
        option, (key, eq, _) = args[i].text, args[i].text.partition("=")
        if key in _PARALLEL_VALUES:
            i += 1 if eq else 2
        elif option in _PARALLEL_FLAGS or re.fullmatch(r"-j\d+", option):
            i += 1
        else:
            problem = f"`parallel` is given the option `{option}`, which Parley does not know"
            return Unwrapped(problem=problem)
    i += i < len(args) and args[i].text == "--"
    words = []
    for word in args[i:]:
        if word.text.startswith(":::"):
            break
        words.append(word)
    text = " ".join(w.text for w in words)
    if not PARALLEL_REPLACEMENT.search(text):
        text += " {}"
    text = PARALLEL_REPLACEMENT.sub('"$(parallel-input)"', text)
    dynamic = "; ".join(w.dynamic for w in words if w.dynamic)
    return Unwrapped(shell=Word(text, dynamic, all(w.known for w in words)))
