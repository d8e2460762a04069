"""CLI tools from `tools.yaml` (docs/tools.md): structured argv, never a shell string.

Each parameter spec becomes a field of a pydantic model built with `create_model`, so
the JSON Schema sent to the LLM and the validation of its arguments are one definition.
Every `{{name}}` fills exactly one argv position. Two rules go beyond the schema, both
towards safety: a `pattern` must match the whole value (as if anchored with `^…$`), and a
value not from an `enum` may not start with `-` wherever it sits in an argv item (option
injection) — a negative number neither — unless its parameter says
`allow_leading_dash: true`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from core.errors import ConfigError, ToolValidationError
from core.tools.base import Category, Tool, ToolContext, ToolResult
from core.tools.running import run_in_workspace

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
HOST_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
PARAM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")

# libyaml's safe loader when PyYAML was built with it (its wheels are): ~10× faster.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ParamSpec(BaseModel):
    """One entry under `parameters:`; keys follow JSON Schema spelling."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["string", "integer", "number", "boolean"] = "string"
    description: str = ""
    enum: list[str | int | float] | None = Field(default=None, min_length=1)
    pattern: str | None = None
    min_length: int | None = Field(default=None, ge=0, alias="minLength")
    max_length: int | None = Field(default=None, ge=0, alias="maxLength")
    minimum: int | float | None = None
    maximum: int | float | None = None
    optional: bool = False
    allow_leading_dash: bool = Field(
        default=False,
        description=(
            "Let a value start with '-', a negative number too (it could then be read as an "
            "option)."
        ),
    )


class CliToolSpec(BaseModel):
    """One entry under `tools:`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
    description: str = Field(min_length=1)
    category: Category
    cmd: str = Field(min_length=1)
    args: list[str] = Field(default=[])
    optional_args: dict[str, list[str]] = Field(default={})
    parameters: dict[str, ParamSpec] = Field(default={})
    env: dict[str, str] = Field(default={})
    timeout: float | None = Field(default=None, gt=0, le=3600)
    idempotent: bool | None = None


class ToolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: list[CliToolSpec] = Field(default=[])


# --- the parameter model -------------------------------------------------------------------


def _field_name(param: str) -> str:
    # Prefixed so a parameter called `schema` or `copy` cannot shadow a BaseModel method;
    # the alias keeps the name the model sees.
    return f"p_{param}"


def _fullmatch(pattern: str) -> Callable[[str], str]:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"must match the pattern {pattern!r} in full")
        return value

    return check


def _annotation(spec: ParamSpec) -> Any:
    """The Python type of one parameter, constraints attached to the inner type so they
    survive `| None` for optional parameters (in validation and in the schema)."""
    if spec.enum is not None:
        return Literal[tuple(spec.enum)]
    if spec.type == "boolean":
        return bool
    if spec.type in {"integer", "number"}:
        number: type = int if spec.type == "integer" else float
        return Annotated[number, Field(ge=spec.minimum, le=spec.maximum)]
    lengths = Field(min_length=spec.min_length, max_length=spec.max_length)
    if spec.pattern is None:
        return Annotated[str, lengths]
    full = AfterValidator(_fullmatch(spec.pattern))
    return Annotated[str, lengths, Field(pattern=spec.pattern), full]


def _params_model(tool_name: str, parameters: dict[str, ParamSpec]) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for name, spec in parameters.items():
        annotation = _annotation(spec)
        description = spec.description or None
        if spec.optional:
            field = Field(None, alias=name, description=description)
            fields[_field_name(name)] = (annotation | None, field)
        else:
            fields[_field_name(name)] = (annotation, Field(alias=name, description=description))
    title = "".join(part.title() for part in re.split(r"[_-]", tool_name)) + "Params"
    config = ConfigDict(extra="forbid", regex_engine="python-re")
    model: type[BaseModel] = create_model(title, __config__=config, **fields)
    return model


# --- the tool ------------------------------------------------------------------------------


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class CliTool(Tool):
    """One `tools.yaml` entry as a tool; `env` holds its already-expanded variables."""

    deferrable = True

    def __init__(self, spec: CliToolSpec, env: Mapping[str, str]) -> None:
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self.category = spec.category
        self.params = _params_model(spec.name, spec.parameters)
        self.timeout = spec.timeout
        self.env = dict(env)

    @property
    def idempotent(self) -> bool:
        declared = self.spec.idempotent
        return super().idempotent if declared is None else declared

    def argv(self, args: BaseModel) -> list[str]:
        """The argv for validated `args`: one argv item per template item.

        Raises:
            ToolValidationError: a value would be read as an option or holds a NUL byte.
        """
        values = {name: getattr(args, _field_name(name)) for name in self.spec.parameters}
        items = list(self.spec.args)
        for param, extra in self.spec.optional_args.items():
            if values[param] is not None and values[param] is not False:
                items += extra
        return [self.spec.cmd, *(self._render(item, values) for item in items)]

    def _render(self, template: str, values: dict[str, Any]) -> str:
        def fill(match: re.Match[str]) -> str:
            name = match.group(1)
            value, param = values[name], self.spec.parameters[name]
            text = _text(value)
            if "\0" in text:
                raise ToolValidationError(f"`{name}` must not contain NUL bytes")
            # Wherever the value sits (`{{ref}}..HEAD` too): a leading dash could turn the
            # whole argument into an option such as `--output=/tmp/x`; a negative number
            # too (`head {{n}}` with -5 is `head -5`, `-1` to `date` an option).
            dash = text.startswith("-") and not isinstance(value, bool)
            if dash and param.enum is None and not param.allow_leading_dash:
                what = "be negative" if param.type in {"integer", "number"} else "start with '-'"
                raise ToolValidationError(
                    f"`{name}` must not {what} (`{text[:40]}` would be read as an option)"
                )
            return text

        return PLACEHOLDER.sub(fill, template)

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        argv = self.argv(args)
        timeout = self.call_timeout(args, ctx.sandbox)
        # A read tool always runs (cron jobs included): the kernel holds it to reading,
        # whatever the program does (a planted `gpg.program` under `git log`).
        read_only = self.category == "read"
        return await run_in_workspace(argv, ctx, timeout=timeout, env=self.env, read_only=read_only)


# --- loading -------------------------------------------------------------------------------


class _Problem(Exception):
    """A semantic problem in one tool entry: the key below `tools[i]`, what and how."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.key, self.problem, self.fix = key, problem, fix


_ENUM_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


def _check_parameters(spec: CliToolSpec) -> None:
    for name, param in spec.parameters.items():
        key = f"parameters.{name}"
        if not PARAM_NAME.fullmatch(name):
            raise _Problem(key, f"`{name}` is not a valid parameter name", "use [A-Za-z0-9_]")
        if param.type != "string" and (param.pattern or param.min_length or param.max_length):
            raise _Problem(key, "pattern/minLength/maxLength apply to strings only", "drop them")
        for value in param.enum or []:
            if not isinstance(value, _ENUM_TYPES[param.type]) or isinstance(value, bool):
                raise _Problem(
                    f"{key}.enum",
                    f"{value!r} is not of type {param.type}",
                    "quote or fix the value",
                )
        if param.pattern is not None:
            try:
                re.compile(param.pattern)
            except re.error as exc:
                raise _Problem(f"{key}.pattern", f"invalid regex: {exc}", "fix it") from exc


def _check_templates(spec: CliToolSpec) -> None:
    params = spec.parameters
    if PLACEHOLDER.search(spec.cmd):
        raise _Problem("cmd", "`cmd` cannot hold a placeholder", "put parameters in `args`")
    used: set[str] = set()
    for i, item in enumerate(spec.args):
        for name in PLACEHOLDER.findall(item):
            if name not in params:
                raise _Problem(f"args[{i}]", f"unknown placeholder {{{{{name}}}}}", "declare it")
            if params[name].optional:
                fix = f"move it to `optional_args: {{{name}: [...]}}`"
                raise _Problem(f"args[{i}]", f"optional `{name}` used in args", fix)
            used.add(name)
    for param, items in spec.optional_args.items():
        if param not in params or not params[param].optional:
            fix = "list only parameters marked `optional: true`"
            raise _Problem(f"optional_args.{param}", "not an optional parameter", fix)
        used.add(param)
        for name in (n for item in items for n in PLACEHOLDER.findall(item)):
            if name != param and (name not in params or params[name].optional):
                fix = f"use {{{{{param}}}}} or a required parameter"
                raise _Problem(f"optional_args.{param}", f"cannot use {{{{{name}}}}}", fix)
    for name in params.keys() - used:
        raise _Problem(f"parameters.{name}", "never used in args or optional_args", "use it")


def _expand_env(spec: CliToolSpec, environ: Mapping[str, str]) -> dict[str, str]:
    env = {}
    for var, template in spec.env.items():
        for host in HOST_VAR.findall(template):
            if host not in environ:
                fix = f"export {host} before starting Parley, or remove `env.{var}`"
                raise _Problem(f"env.{var}", f"host variable `{host}` is not set", fix)
        env[var] = HOST_VAR.sub(lambda m: environ[m.group(1)], template)
    return env


def _build(spec: CliToolSpec, environ: Mapping[str, str]) -> Tool:
    _check_parameters(spec)
    _check_templates(spec)
    return CliTool(spec, _expand_env(spec, environ))


def _validation_error(exc: ValidationError, raw: object, source: str) -> ConfigError:
    first = exc.errors(include_url=False)[0]
    loc = first["loc"]
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    problem = first["msg"]
    if len(loc) >= 2 and isinstance(raw, dict) and isinstance(loc[1], int):
        entries = raw.get("tools")
        entry = entries[loc[1]] if isinstance(entries, list) else None
        if isinstance(entry, dict) and "name" in entry:
            problem += f" (tool `{entry['name']}`)"
    fix = "see the commented example tools.yaml for the expected shape"
    return ConfigError(key or "tools", problem, fix, source=source)


def load_cli_tools(
    path: Path, environ: Mapping[str, str] = os.environ, reserved: Collection[str] = ()
) -> list[Tool]:
    """Load the CLI tools defined in `path`; `reserved`: names taken by built-in tools.

    Raises:
        ConfigError: unreadable YAML, a bad entry, a name already taken, or an `${VAR}`
            missing from `environ`; the key names the entry (`tools[2].args[1]`).
    """
    source = str(path)
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER)
        spec = ToolsFile.model_validate(raw or {})
    except OSError as exc:
        problem = f"cannot read the file: {exc}"
        raise ConfigError("tools", problem, "fix the path", source=source) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(
            "tools", f"not valid YAML: {exc}", "fix the syntax", source=source
        ) from exc
    except ValidationError as exc:
        raise _validation_error(exc, raw, source) from exc
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(spec.tools):
        if entry.name in seen:
            problem = f"tool `{entry.name}` is defined twice (first at tools[{seen[entry.name]}])"
            raise ConfigError(f"tools[{i}].name", problem, "rename one", source=source)
        if entry.name in reserved:
            problem = f"`{entry.name}` is the name of a built-in tool"
            fix = f"rename it (e.g. `team_{entry.name}`); built-ins: {', '.join(sorted(reserved))}"
            raise ConfigError(f"tools[{i}].name", problem, fix, source=source)
        seen[entry.name] = i
        try:
            tools.append(_build(entry, environ))
        except _Problem as exc:
            problem = f"{exc.problem} (tool `{entry.name}`)"
            raise ConfigError(f"tools[{i}].{exc.key}", problem, exc.fix, source=source) from exc
    return tools
