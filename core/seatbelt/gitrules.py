"""`git` command lines, for the `bash` blocklist: what rewrites history or discards work,
and what makes git run a program of the command line's choosing.

Tools already run git with its program-running settings overridden (`gitenv.py`), but
configuration given on the command line (`git -c`, `--config-env`, `GIT_CONFIG_*`) is read
after those overrides and wins, so it needs an approver unless it only sets a key known to
be harmless. So does a subcommand git does not have: it may be an alias, and an alias that
starts with `!` is a shell command.
"""

from __future__ import annotations

import re

from core.seatbelt.programargs import options
from core.seatbelt.verdicts import OK, BlockVerdict, unreadable

# Keys `git -c` may set without an approver: none of them makes git run a program.
HARMLESS_KEY = re.compile(
    r"(?i)(user\.(name|email)|author\.(name|email)|committer\.(name|email)|color\..*|"
    r"advice\..*|init\.defaultbranch|safe\.directory|core\.(quotepath|autocrlf|safecrlf|"
    r"filemode|ignorecase|abbrev|eol|longpaths)|pull\.(rebase|ff)|merge\.(ff|conflictstyle)|"
    r"diff\.(noprefix|renames|algorithm|mnemonicprefix|context|interhunkcontext)|"
    r"log\.(decorate|date|follow|abbrevcommit)|push\.default|fetch\.prune|gc\.auto|"
    r"maintenance\.auto|protocol\.version|column\.ui|status\.\w+|commit\.gpgsign|"
    r"tag\.gpgsign|log\.showsignature|rebase\.autosquash|rerere\.enabled)"
)
# Keys that name a program git runs (or a file of more configuration): setting one with
# `git config` makes a later, innocent-looking git command run it.
RUNNING_KEY = re.compile(
    r"(?i)(alias\..*|include\..*|includeif\..*|core\.(pager|editor|sshcommand|fsmonitor|"
    r"hookspath|askpass|gitproxy|alternaterefscommand|attributesfile)|"
    r"sequence\.editor|diff\.external|pager\..*|credential\..*|gpg\..*|url\..*|"
    r"uploadpack\..*|protocol\..*|submodule\..*|hook\..*|sendemail\..*|web\.browser|"
    r"browser\..*|man\..*|instaweb\..*|remote\..*\.(uploadpack|receivepack|vcs)|"
    r".*\.(command|cmd|program|textconv|helper|clean|smudge|process|driver|path|tool|extcmd))"
)
# Subcommands git has (2.39 to 2.50) and the common external `git lfs`; anything else may
# be an alias.
GIT_COMMANDS = frozenset(
    str.split(
        """add am annotate apply archive backfill bisect blame branch bugreport bundle cat-file
    check-attr check-ignore check-mailmap check-ref-format checkout checkout-index cherry
    cherry-pick citool clean clone column commit commit-graph commit-tree config count-objects
    credential credential-cache credential-store describe diagnose diff diff-files diff-index
    diff-pairs diff-tree fast-export fast-import fetch fetch-pack fmt-merge-msg for-each-ref
    for-each-repo format-patch fsck fsck-objects fsmonitor--daemon gc get-tar-commit-id grep
    gui hash-object help hook http-backend index-pack init init-db interpret-trailers
    last-modified lfs log ls-files ls-remote ls-tree mailinfo mailsplit maintenance merge
    merge-base merge-file merge-index merge-tree mktag mktree multi-pack-index mv name-rev
    notes pack-objects pack-redundant pack-refs patch-id prune prune-packed pull push
    range-diff read-tree rebase receive-pack reflog refs remote repack replace replay repo
    request-pull rerere reset restore rev-list rev-parse revert rm send-pack shortlog show
    show-branch show-index show-ref sparse-checkout stage stash status stripspace submodule
    switch symbolic-ref tag unpack-file unpack-objects update-index update-ref
    update-server-info upload-archive upload-pack var verify-commit verify-pack verify-tag
    version whatchanged worktree write-tree"""
    )
)
# Subcommands whose job is to run a program (a diff or merge tool, a filter, a browser).
RUNNING_COMMANDS = frozenset({"difftool", "mergetool", "filter-branch", "filter-repo",
                              "instaweb", "web--browse", "remote-ext", "send-email"})  # fmt: skip
# Options of a subcommand that name a program to run.
RUNNING_OPTIONS = re.compile(
    r"(--upload-pack|--receive-pack|--exec|--open-files-in-pager|--extcmd|--web)(=.*)?"
)
_GLOBAL_VALUES = frozenset(
    {"-C", "-c", "--config-env", "--git-dir", "--work-tree", "--namespace", "--super-prefix",
     "--list-cmds", "--attr-source"}
)  # fmt: skip
_CONFIG_READS = frozenset({"--get", "--get-all", "--get-regexp", "--get-urlmatch", "--list",
                           "-l", "--get-color", "--get-colorbool", "get", "list"})  # fmt: skip
_CONFIG_VALUES = frozenset({"-f", "--file", "--blob", "--type", "--default", "--comment"})


def git_rules(args: list[str]) -> BlockVerdict:
    """The verdict on `git` with the static words `args`."""
    while args and args[0].startswith("-"):  # global options: -C dir, -c k=v, --no-pager
        option, value = args[0].partition("=")[0], args[1] if len(args) > 1 else ""
        value = args[0].partition("=")[2] or value
        if option == "-c" and not _harmless_setting(value):
            return unreadable(f"`git -c {value}` sets configuration that can run programs")
        if option == "--config-env":
            return unreadable("`git --config-env` sets configuration that can run programs")
        if option == "--exec-path" and "=" in args[0]:
            return unreadable("`git --exec-path=…` runs git's helpers from another directory")
        args = args[2:] if args[0] in _GLOBAL_VALUES else args[1:]
    if not args:
        return OK
    sub, rest = args[0], args[1:]
    if sub in RUNNING_COMMANDS:
        return unreadable(f"`git {sub}` runs other programs")
    if sub not in GIT_COMMANDS:
        return unreadable(f"`git {sub}` may be an alias, which can run a shell command")
    if any(RUNNING_OPTIONS.fullmatch(arg) for arg in rest) or (
        sub == "clone" and ("-u" in rest or _clone_config(rest))
    ):
        return unreadable(f"`git {sub}` is given a program or configuration to run")
    return _runs_code(sub, rest) or _destroys(sub, rest)


def _harmless_setting(setting: str) -> bool:
    key, _, value = setting.partition("=")
    harmless_pager = key.lower() in {"core.pager", "core.editor"} and value in {"cat", "true"}
    return bool(HARMLESS_KEY.fullmatch(key)) or harmless_pager


def _clone_config(rest: list[str]) -> bool:
    settings = [rest[i + 1] for i, a in enumerate(rest[:-1]) if a in {"-c", "--config"}]
    settings += [a.split("=", 1)[1] for a in rest if a.startswith("--config=")]
    return not all(_harmless_setting(s) for s in settings)


def _runs_code(sub: str, rest: list[str]) -> BlockVerdict | None:
    opts, operands = options(rest)
    if sub == "rebase" and (opts & {"-x", "--exec"} or any(a.startswith("--exec=") for a in rest)):
        return unreadable("`git rebase --exec` runs a shell command after each commit")
    if sub == "grep" and any(a.startswith("-O") for a in rest):
        return unreadable("`git grep -O` opens the matches with a program")
    if (sub, operands[0] if operands else "") in {("bisect", "run"), ("submodule", "foreach")}:
        return unreadable(f"`git {sub} {operands[0]}` runs a shell command")
    if sub == "config" and not (_CONFIG_READS & (opts | set(rest[:1]))):
        keys = [a for i, a in enumerate(rest) if not a.startswith("-")
                and (i == 0 or rest[i - 1] not in _CONFIG_VALUES)]  # fmt: skip
        keys = keys[1:] if keys[:1] in (["set"], ["unset"]) else keys
        if keys and RUNNING_KEY.fullmatch(keys[0]):
            return unreadable(f"`git config {keys[0]}` makes git run a program later")
    return None


def _destroys(sub: str, rest: list[str]) -> BlockVerdict:
    opts, operands = options(rest)
    if sub == "push" and (
        opts & {"-f", "--force", "--force-with-lease", "--delete", "-d", "--mirror"}
        or any(o.startswith(("+", ":")) for o in operands)
    ):
        return BlockVerdict("destructive", "`git push` that rewrites or deletes remote history")
    reason = _local_loss(sub, opts, operands, rest)
    return BlockVerdict("destructive", reason) if reason else OK


def _local_loss(sub: str, opts: set[str], operands: list[str], rest: list[str]) -> str:
    """Why `git sub …` loses local work (changes, files, branches, stashes), or ""."""
    first = operands[0] if operands else ""
    forced = bool(opts & {"-f", "--force"})
    if sub == "reset" and opts & {"--hard", "--merge"}:
        return "`git reset --hard` discards local changes"
    if sub == "clean" and forced:
        return "`git clean -f` deletes untracked files"
    if sub == "checkout" and (forced or "--" in rest or {".", ":/"} & set(operands)):
        return "`git checkout` over local changes discards them"
    if sub == "restore" and not (opts & {"-S", "--staged"} and not opts & {"-W", "--worktree"}):
        return "`git restore` discards local changes"
    if sub == "switch" and (forced or "--discard-changes" in opts):
        return "`git switch --discard-changes` discards local changes"
    if sub == "branch" and (
        opts & {"-D", "-M", "-C"} or (forced and opts & {"-d", "--delete", "-m", "--move"})
    ):
        return "`git branch -D`/`-M` deletes or overwrites a branch"
    if sub == "stash" and first in {"drop", "clear"}:
        return f"`git stash {first}` deletes stashed work"
    if (sub == "rm" and forced) or (sub == "worktree" and first == "remove" and forced):
        return f"`git {sub} --force` deletes uncommitted changes"
    if (sub == "reflog" and first in {"expire", "delete"}) or sub == "prune":
        return f"`git {sub}` drops what lost commits could be recovered from"
    if sub == "gc" and any(a.startswith("--prune") and a != "--prune=never" for a in rest):
        return "`git gc --prune` deletes unreachable commits"
    if sub == "update-ref" and "-d" in opts:
        return "`git update-ref -d` deletes a ref"
    return ""
