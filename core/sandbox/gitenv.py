"""git in every tool process runs with the settings that make it run programs overridden.

A repository is data the model (or whoever wrote the repository) controls, and its
`.git/config` can name programs that innocent-looking commands run: `git status` runs
`core.fsmonitor`, `git log` runs `gpg.program` when `log.showSignature` is on, `git commit`
runs hooks, `git fetch` runs `core.sshCommand`. Configuration given through
`GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n` is read after the system, global,
repository and included files, so for every key listed here it wins, however the
repository spells or includes its own. System and global files are not read at all.

Not covered, because the key's name is the repository's choice or no value of it is
harmless: filter drivers (`filter.<name>.clean/smudge/process`), diff drivers
(`diff.<name>.command/textconv`), merge drivers, `diff.external` (empty makes every
`git diff` fail), `remote.<name>.uploadpack`, `submodule.<name>.update`, `alias.*`. Those
run with the tool's own rights inside the kernel sandbox; the `bash` seatbelt asks an
approver before a command line sets any of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Each key, and the value that keeps git from running a program of the repository's choice.
OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),  # not a directory: no hook is found
    ("core.pager", "cat"),
    ("core.editor", "true"),  # keeps the prepared message (or aborts an empty commit)
    ("sequence.editor", "true"),
    ("core.sshCommand", "ssh"),
    ("core.askPass", ""),  # empty: no helper program, and no terminal to prompt on
    ("credential.helper", ""),  # empty resets the list, URL-specific helpers included
    ("core.alternateRefsCommand", "true"),  # advertises no alternate tips: only slower
    ("gpg.program", "false"),
    ("gpg.openpgp.program", "false"),
    ("gpg.x509.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.ssh.defaultKeyCommand", "false"),
    ("log.showSignature", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("push.gpgSign", "false"),
    ("protocol.ext.allow", "never"),
)
# Set for every tool; a tool's own `env` in tools.yaml may still set the last three.
GIT_ENV: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_COUNT": str(len(OVERRIDES)),
    **{f"GIT_CONFIG_KEY_{i}": key for i, (key, _) in enumerate(OVERRIDES)},
    **{f"GIT_CONFIG_VALUE_{i}": value for i, (_, value) in enumerate(OVERRIDES)},
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",  # beats `pager.<command>`, which no override can name
    "GIT_PROXY_COMMAND": "",  # set, even empty, it stops git reading `core.gitProxy`
}
# Host variables that make git (or ssh under it) run a program, or feed git configuration.
RUNS_PROGRAM = re.compile(
    r"GIT_(EXTERNAL_DIFF|SSH|SSH_COMMAND|PAGER|EDITOR|SEQUENCE_EDITOR|ASKPASS|"
    r"PROXY_COMMAND|EXEC_PATH|TEMPLATE_DIR|CONFIG.*)|SSH_ASKPASS|LESSOPEN|LESSCLOSE"
)


def neutralised(host: Mapping[str, str], declared: Mapping[str, str]) -> dict[str, str]:
    """A tool's environment from the allowlisted `host` variables (those that run programs
    dropped) and the tool's `declared` ones, with git's overrides in place."""
    env = {key: value for key, value in host.items() if not RUNS_PROGRAM.fullmatch(key)}
    env.update(GIT_ENV)
    env.update({k: v for k, v in declared.items() if not k.startswith("GIT_CONFIG")})
    return env
