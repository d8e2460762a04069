"""The tool contract: one definition gives the schema sent to the LLM and the validation
applied to its arguments (a pydantic model), plus category, idempotency and timeout."""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from core.chat import Asker
from core.errors import ToolValidationError
from core.records import record
from core.sandbox import (
    Jail,
    SandboxSettings,
    ToolSite,
)

if TYPE_CHECKING:
    from pydantic.json_schema import GenerateJsonSchema

    from core.agent.journal import JournalBox
    from core.memory.service import Memory
    from core.messages import ToolCall
    from core.tools.delegation import Delegator

Category = Literal["read", "write", "admin"]


@record(frozen=True, slots=True)
class ToolResult:
    """What a tool produced: `text` goes to the model (a cut output says so in it);
    `artifacts` are files that hold the full output when `text` is cut."""

    text: str
    is_error: bool = False
    artifacts: tuple[Path, ...] = ()


@record(slots=True)
class ToolContext:
    """Everything a running tool may use; built once per run by the caller."""

    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    journal: JournalBox | None = None  # the conversation's run journal (its three tools)
    memory: Memory | None = None  # long-term memory; None where it is off
    jail: Jail | None = None  # None: built from `sandbox` on first use
    scratch: Path | None = None  # the run's temp dir (HOME and TMPDIR of tools); None: per call
    cwd: Path | None = None  # where the tool starts; None: the workspace
    env: Mapping[str, str] = field(default_factory=dict)  # the run's extra variables
    call_id: str = ""  # the call being run (set per call by the executor)
    delegator: Delegator | None = None  # starts child runs (`delegate`); None: cannot
    asker: Asker | None = None  # who the run answers, where (per-person state is scoped by it)
    # The run's workspace, scratch and artifacts (None: a run outside any conversation, in
    # the workspace root; see core/sandbox/site.py). Set per call by the executor.
    site: ToolSite | None = None
    search: ToolFinder | None = None  # the run's tool search (`find_tools`); None: off


class ToolFinder(Protocol):
    """A run's tool search (core/tools/search.py), as `find_tools` uses it."""

    def find(self, query: str, limit: int) -> list[Tool]:
        """The tools that best match `query`, from now on offered to the run."""

    def hidden(self) -> list[Tool]:
        """The tools not offered to the run yet."""


class Tool(ABC):
    """Base of every tool. Subclasses set the class attributes and implement `run`."""

    name: str = ""
    description: str = ""
    category: Category = "read"
    params: type[BaseModel]
    timeout: float | None = None  # None: the sandbox default
    # Safe to run again after a crash although it has effects: it keeps its own durable
    # record and picks up from it (`delegate`'s child runs). Recorded as idempotent in the
    # envelope, so resume runs it again instead of halting; never retried on failure.
    resumable: bool = False
    # Offered only once `find_tools` found it when a run has more tools than
    # `[tools] search_threshold` (the team's tools.yaml and MCP tools); built-ins always are.
    deferrable: bool = False

    @property
    def idempotent(self) -> bool:
        """Safe to run twice: read tools by default."""
        return self.category == "read"

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the parameters, as sent to the LLM."""
        schema: dict[str, Any] = compact_schema(
            self.params.model_json_schema(schema_generator=_json_schema_generator())
        )
        return schema

    def validate(self, raw_arguments: str) -> BaseModel:
        """Parse and validate the model's raw JSON arguments.

        Raises:
            ToolValidationError: bad JSON or a schema violation, phrased for the model.
        """
        data = parse_arguments(self.name, raw_arguments)
        try:
            return self.params.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
                for err in exc.errors(include_url=False)
            )
            raise ToolValidationError(f"invalid arguments for `{self.name}`: {problems}") from exc

    def call_timeout(self, args: BaseModel, sandbox: SandboxSettings) -> float:
        """Seconds this call may run (the tool's own, else the sandbox default; capped)."""
        return min(self.timeout or sandbox.default_timeout, sandbox.max_timeout)

    def effective_category(self, args: BaseModel) -> Category:
        """The category of this particular call (bash escalates destructive commands)."""
        return self.category

    @abstractmethod
    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        """Run the tool. Raise `ToolError` subclasses for failures the model should see."""


def parse_arguments(tool: str, raw_arguments: str) -> dict[str, Any]:
    """The model's raw arguments for `tool` as a JSON object.

    Raises:
        ToolValidationError: not JSON, or not an object, phrased for the model.
    """
    try:
        data = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ToolValidationError(
            f"arguments for `{tool}` are not valid JSON ({exc.msg} at char {exc.pos}); "
            "send a JSON object matching the tool's schema"
        ) from exc
    if not isinstance(data, dict):
        raise ToolValidationError(f"arguments for `{tool}` must be a JSON object")
    return data


@record(frozen=True, slots=True)
class ToolSpec:
    """What a provider needs to describe one tool to the model."""

    name: str
    description: str
    parameters: dict[str, Any]


class ToolRegistry:
    """Tools by name; also caches the specs sent with every LLM call.

    `refused` names tools that exist but are never offered (an MCP tool the configuration
    denies), with why: a call by name is refused with that reason. A key ending in `*`
    covers every name it begins, for tools that cannot be named yet (the tools of an MCP
    server that has not started): a call to one is answered with the reason as it is."""

    def __init__(
        self, tools: Iterable[Tool] = (), refused: Mapping[str, str] | None = None
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._specs: tuple[ToolSpec, ...] | None = None
        self.refused: dict[str, str] = dict(refused or {})
        for tool in tools:
            self.add(tool)

    def tools(self) -> list[Tool]:
        """Every tool, in the order they were added."""
        return list(self._tools.values())

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool `{tool.name}` is registered twice")
        self._tools[tool.name] = tool
        self._specs = None

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def unavailable(self, name: str) -> str | None:
        """Why a tool `name` that is not here cannot be used (a `*` key of `refused`)."""
        for key, why in self.refused.items():
            if key.endswith("*") and name.startswith(key[:-1]):
                return why
        return None

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        if self._specs is None:
            tools = self._tools.values()
            # `Tool.schema` for most, made together (`_schemas_of`); a tool's own the rest
            shared = _schemas_of([t.params for t in tools if type(t).schema is Tool.schema])
            specs = []
            for tool in tools:
                schema = shared.get(tool.params) if type(tool).schema is Tool.schema else None
                specs.append(ToolSpec(tool.name, tool.description, schema or tool.schema()))
            self._specs = tuple(specs)
        return self._specs


def _schemas_of(models: list[type[BaseModel]]) -> dict[type[BaseModel], dict[str, Any]]:
    """`Tool.schema` of each of `models`, made in one pass of pydantic's JSON Schema
    generator rather than one pass each: the same schemas, in about 60 % of the time
    (docs/benchmarks.md)."""
    if not models:
        return {}
    from pydantic.json_schema import models_json_schema

    refs, top = models_json_schema(
        [(model, "validation") for model in models], schema_generator=_json_schema_generator()
    )
    defs = top.get("$defs", {})
    schemas = {m: compact_schema({**refs[(m, "validation")], "$defs": defs}) for m in models}
    # A model that contains itself keeps `$defs`: here they would be every model's.
    return {model: schema for model, schema in schemas.items() if "$defs" not in schema}


@functools.cache
def _json_schema_generator() -> type[GenerateJsonSchema]:
    """pydantic's JSON Schema generator, but a default that is already JSON (a number, a
    string, true/false, null) is written as it is: pydantic's own way builds a
    `TypeAdapter` for each default's type, which loads that machinery for the first
    request of a one-shot turn (docs/benchmarks.md)."""
    from pydantic.json_schema import GenerateJsonSchema

    class _Generator(GenerateJsonSchema):
        def encode_default(self, dft: Any) -> Any:
            if dft is None or type(dft) in (bool, int, float, str):
                return dft
            return super().encode_default(dft)

    return _Generator


def compact_schema(schema: Any) -> Any:
    """A JSON Schema as the model needs it, sent with every request: without pydantic's
    titles (they repeat the property names), nested models written in place of their
    `$ref` (unless one refers to itself), and an optional field's `anyOf [X, null]` with
    default null just X (the model leaves it out; validation still allows null).
    """
    defs = schema.get("$defs") if isinstance(schema, dict) else None
    if isinstance(defs, dict):
        try:
            inlined = _inline_refs({k: v for k, v in schema.items() if k != "$defs"}, defs, ())
        except RecursionError:  # a model that contains itself keeps its `$defs`
            pass
        else:
            return _compact(inlined)
    return _compact(schema)


def _inline_refs(node: Any, defs: dict[str, Any], inside: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline_refs(item, defs, inside) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name in inside or name not in defs:
            raise RecursionError(name)
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _inline_refs({**defs[name], **rest}, defs, (*inside, name))
    return {key: _inline_refs(value, defs, inside) for key, value in node.items()}


def _compact(node: Any) -> Any:
    if isinstance(node, list):
        return [_compact(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _compact(sub) for name, sub in value.items()}
        else:
            out[key] = _compact(value)
    branches = out.get("anyOf")
    if isinstance(branches, list) and "default" in out and out["default"] is None:
        kept = [b for b in branches if b != {"type": "null"}]
        if len(kept) == 1 and len(kept) < len(branches):
            del out["anyOf"], out["default"]
            out = {**kept[0], **out}
    return out


class RoleGate(Protocol):
    """What the person a run answers may use (docs/governance.md#roles): asked before
    the run's own policy, so a tool runs only if both allow it; a tool it refuses is not
    offered to the model either (`core.tools.search.offered_specs`)."""

    @property
    def names(self) -> str:
        """The person's roles, for the audit log."""
        ...

    def allows_tool(self, tool: str, category: str) -> bool:
        """Whether the person may use `tool` for a call of `category`."""
        ...

    def tool_refusal(self, tool: str, category: str) -> str | None:
        """Why the person may not use `tool` for a call of `category` (naming the roles
        that may); None if they may."""
        ...


Approver = Callable[[str, str, str], Awaitable[bool]]
"""`await approver(tool_name, summary_of_call, reason)` → True to allow."""


@runtime_checkable
class CallApprover(Protocol):
    """An approver that is told which call it decides: the agent keeps each request in
    the store under (run, call id), so a restart does not lose it (docs/tools.md)."""

    async def __call__(self, tool: str, summary: str, reason: str) -> bool: ...

    async def approve_call(
        self, call: ToolCall, summary: str, reason: str, *, grantable: bool = False
    ) -> bool:
        """True to allow `call`. `grantable`: the call is its tool's own category, so a
        durable grant ("approve always") may answer it, and an approver may give one."""
