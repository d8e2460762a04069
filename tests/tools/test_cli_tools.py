"""Loading `tools.yaml`: schemas, argv templates and config errors that name the key."""

from __future__ import annotations

import enum
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from core.errors import ConfigError, ToolValidationError
from core.messages import ToolCall
from core.sandbox.settings import SandboxSettings
from core.tools.base import Tool, ToolContext, ToolRegistry, ToolResult, compact_schema
from core.tools.cli import CliTool, load_cli_tools
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy

SPEC_EXAMPLE = """
tools:
  - name: kubectl_get
    description: "Get Kubernetes resources"
    category: read
    cmd: echo
    args: ["get", "{{resource}}"]
    optional_args:
      namespace: ["-n", "{{namespace}}"]
      limit: ["--limit={{limit}}"]
      wide: ["-o", "wide"]
    timeout: 30
    env:
      KUBECONFIG: "${HOST_KUBECONFIG}"
    parameters:
      resource: {type: string, enum: [pods, services], description: "The resource type"}
      namespace: {type: string, pattern: "^[a-z0-9-]+$", optional: true}
      limit: {type: integer, minimum: 1, maximum: 500, optional: true}
      wide: {type: boolean, optional: true}
  - name: kubectl_apply
    description: "Apply a manifest"
    category: write
    cmd: echo
    args: ["apply", "-f", "{{file}}"]
    idempotent: true
    parameters:
      file: {type: string, maxLength: 100}
"""


def load(tmp_path: Path, body: str, environ: dict[str, str] | None = None) -> list[Tool]:
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return load_cli_tools(path, environ={"HOST_KUBECONFIG": "/k"} if environ is None else environ)


def test_spec_example_loads_with_schema_category_and_env(tmp_path: Path) -> None:
    get, apply = load(tmp_path, SPEC_EXAMPLE)
    assert isinstance(get, CliTool)
    assert isinstance(apply, CliTool)
    assert (get.name, get.category, get.timeout, get.idempotent) == (
        "kubectl_get",
        "read",
        30,
        True,
    )
    assert (apply.category, apply.timeout, apply.idempotent) == ("write", None, True)
    assert get.env == {"KUBECONFIG": "/k"}
    schema = get.schema()
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["resource"]
    props = schema["properties"]
    assert props["resource"]["enum"] == ["pods", "services"]
    assert props["resource"]["description"] == "The resource type"
    # Optional parameters are sent as their type alone (no `anyOf […, null]`): the model
    # leaves them out, and validation still takes null.
    assert props["namespace"] == {"pattern": "^[a-z0-9-]+$", "type": "string"}
    assert props["limit"] == {"minimum": 1, "maximum": 500, "type": "integer"}
    assert get.validate('{"resource": "pods", "namespace": null}')
    assert apply.schema()["properties"]["file"]["maxLength"] == 100


@pytest.mark.parametrize(
    ("arguments", "argv"),
    [
        ({"resource": "pods"}, ["echo", "get", "pods"]),
        (
            {"resource": "pods", "namespace": "kube-system", "limit": 5, "wide": True},
            ["echo", "get", "pods", "-n", "kube-system", "--limit=5", "-o", "wide"],
        ),
        ({"resource": "services", "wide": False}, ["echo", "get", "services"]),
    ],
)
def test_argv_fills_one_position_per_placeholder(
    tmp_path: Path, arguments: dict[str, object], argv: list[str]
) -> None:
    tool = load(tmp_path, SPEC_EXAMPLE)[0]
    assert isinstance(tool, CliTool)
    assert tool.argv(tool.validate(json.dumps(arguments))) == argv


def test_value_with_spaces_stays_one_argument(tmp_path: Path) -> None:
    apply = load(tmp_path, SPEC_EXAMPLE)[1]
    assert isinstance(apply, CliTool)
    args = apply.validate(json.dumps({"file": "my manifest.yaml; ls"}))
    assert apply.argv(args) == ["echo", "apply", "-f", "my manifest.yaml; ls"]


def test_leading_dash_is_refused_as_option_injection(tmp_path: Path) -> None:
    apply = load(tmp_path, SPEC_EXAMPLE)[1]
    assert isinstance(apply, CliTool)
    with pytest.raises(ToolValidationError, match="must not start with '-'"):
        apply.argv(apply.validate(json.dumps({"file": "--kubeconfig=/evil"})))


NUMBERS = """
tools:
  - name: last_lines
    description: "The last lines of the log."
    category: read
    cmd: echo
    args: ["{{lines}}", "app.log"]
    optional_args:
      scale: ["--scale={{scale}}"]
    parameters:
      lines: {type: integer}
      scale: {type: number, optional: true}
  - name: shift
    description: "Shift by an offset."
    category: read
    cmd: echo
    args: ["{{offset}}", "{{step}}"]
    parameters:
      offset: {type: integer, allow_leading_dash: true}
      step: {type: integer, enum: [-1, 1]}
"""


@pytest.mark.parametrize(
    "arguments",
    [{"lines": -5}, {"lines": 5, "scale": -0.5}, {"lines": 5, "scale": -0.0}],
)
async def test_a_negative_number_is_refused_as_option_injection(
    tmp_path: Path, arguments: dict[str, object]
) -> None:
    """`head {{n}}` with -5 is `head -5`: a negative number is a leading dash too."""
    tool = load(tmp_path, NUMBERS)[0]
    settings = SandboxSettings(workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art")
    executor = ToolExecutor(ToolRegistry([tool]), ToolPolicy(), ToolContext(settings))
    call = ToolCall(id="c1", name="last_lines", arguments=json.dumps(arguments))
    result = await executor.execute(call)
    assert result.is_error
    assert "must not be negative" in result.content
    assert "would be read as an option" in result.content
    assert "app.log" not in result.content  # echo never ran


def test_a_number_may_be_negative_by_opt_in_or_enum(tmp_path: Path) -> None:
    last_lines, shift = load(tmp_path, NUMBERS)
    assert isinstance(last_lines, CliTool)
    assert isinstance(shift, CliTool)
    args = last_lines.validate('{"lines": 5, "scale": 1e-05}')
    assert last_lines.argv(args) == ["echo", "5", "app.log", "--scale=1e-05"]
    args = shift.validate('{"offset": -3, "step": -1}')
    assert shift.argv(args) == ["echo", "-3", "-1"]


def test_pattern_must_match_in_full(tmp_path: Path) -> None:
    tool = load(
        tmp_path,
        """
        tools:
          - {name: t, description: d, category: read, cmd: echo, args: ["{{x}}"],
             parameters: {x: {type: string, pattern: "[a-z]+"}}}
        """,
    )[0]
    assert tool.validate('{"x": "abc"}')
    with pytest.raises(ToolValidationError, match="in full"):
        tool.validate('{"x": "abc; rm -rf ~"}')


async def test_cli_tool_timeout_kills_it(tmp_path: Path) -> None:
    tool = load(
        tmp_path,
        """
        tools:
          - {name: nap, description: d, category: read, cmd: sleep, args: ["5"], timeout: 0.3}
        """,
    )[0]
    settings = SandboxSettings(workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art")
    executor = ToolExecutor(ToolRegistry([tool]), ToolPolicy(), ToolContext(settings))
    result = await executor.execute(ToolCall(id="c", name="nap"))
    assert result.is_error
    assert "killed after 0.3s" in result.content


async def test_missing_program_is_an_error_result(tmp_path: Path) -> None:
    tool = load(
        tmp_path,
        """
        tools:
          - {name: ghost, description: d, category: read, cmd: no-such-program-xyz}
        """,
    )[0]
    settings = SandboxSettings(workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art")
    executor = ToolExecutor(ToolRegistry([tool]), ToolPolicy(), ToolContext(settings))
    result = await executor.execute(ToolCall(id="c", name="ghost"))
    assert result.is_error
    assert "cannot start `no-such-program-xyz`" in result.content


def test_empty_file_defines_no_tools(tmp_path: Path) -> None:
    assert load(tmp_path, "") == []
    assert load(tmp_path, "tools: []") == []


def entry(**overrides: object) -> str:
    tool: dict[str, object] = {
        "name": "t",
        "description": "d",
        "category": "read",
        "cmd": "echo",
        "args": ["{{x}}"],
        "parameters": {"x": {"type": "string"}},
    }
    tool.update(overrides)
    return json.dumps({k: v for k, v in tool.items() if v is not None})


BAD_FILES = [
    ("unknown placeholder", entry(args=["{{y}}"]), "tools[0].args[0]", "unknown placeholder"),
    ("unknown type", entry(parameters={"x": {"type": "list"}}), "tools[0].parameters.x.type", ""),
    ("missing cmd", entry(cmd=None), "tools[0].cmd", "Field required"),
    ("extra key", entry(shell=True), "tools[0].shell", "Extra inputs"),
    ("bad category", entry(category="root"), "tools[0].category", ""),
    ("bad regex", entry(parameters={"x": {"pattern": "("}}), "tools[0].parameters.x.pattern", ""),
    ("unused param", entry(args=[]), "tools[0].parameters.x", "never used"),
    ("placeholder in cmd", entry(cmd="{{x}}"), "tools[0].cmd", "placeholder"),
    (
        "optional in args",
        entry(parameters={"x": {"optional": True}}),
        "tools[0].args[0]",
        "optional",
    ),
    (
        "optional_args of a required param",
        entry(optional_args={"x": ["-x"]}),
        "tools[0].optional_args.x",
        "not an optional parameter",
    ),
    (
        "enum type mismatch",
        entry(parameters={"x": {"type": "integer", "enum": ["a"]}}),
        "tools[0].parameters.x.enum",
        "is not of type integer",
    ),
    (
        "pattern on a number",
        entry(parameters={"x": {"type": "number", "pattern": "1"}}),
        "tools[0].parameters.x",
        "strings only",
    ),
]


@pytest.mark.parametrize(
    ("body", "key", "problem"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_bad_entries_name_key_and_tool(tmp_path: Path, body: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"tools: [{entry(name='fine')}, {body}]")
    error = info.value
    assert error.key == key.replace("tools[0]", "tools[1]")
    assert problem in error.problem
    assert "(tool `t`)" in error.problem
    assert error.source == str(tmp_path / "tools.yaml")
    assert error.fix


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"tools: [{entry()}, {entry()}]")
    assert info.value.key == "tools[1].name"
    assert "defined twice" in info.value.problem


def test_missing_host_env_var_names_tool_and_var(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, SPEC_EXAMPLE, environ={})
    assert info.value.key == "tools[0].env.KUBECONFIG"
    assert "HOST_KUBECONFIG" in info.value.problem
    assert "kubectl_get" in info.value.problem


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(tmp_path, "tools: [unclosed")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_cli_tools(tmp_path / "absent.yaml", environ={})


def test_parameter_names_cannot_shadow_model_attributes(tmp_path: Path) -> None:
    tool = load(
        tmp_path,
        """
        tools:
          - {name: t, description: d, category: read, cmd: echo, args: ["{{schema}}"],
             parameters: {schema: {type: string}}}
        """,
    )[0]
    assert isinstance(tool, CliTool)
    assert tool.argv(tool.validate('{"schema": "v"}')) == ["echo", "v"]
    assert list(tool.schema()["properties"]) == ["schema"]


async def test_a_tool_named_like_a_builtin_is_a_config_error(tmp_path: Path) -> None:
    from tests.process import child_env, parley, write_config

    config = write_config(tmp_path)
    (tmp_path / "tools.yaml").write_text(f"tools: [{entry(name='fine')}, {entry(name='bash')}]")
    code, out, err = await parley("--config", str(config), "chat", "-m", "hi", env=child_env())
    assert code == 2, (out, err)
    assert "tools[1].name" in err
    assert "built-in" in err
    assert "Traceback" not in err


def test_compact_schema_drops_titles_but_not_a_property_named_title() -> None:
    schema = {
        "title": "Params",
        "type": "object",
        "properties": {
            "title": {"title": "Title", "type": "string"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}], "default": None},
        },
    }
    assert compact_schema(schema) == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "note": {"type": "string"},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}], "default": None},
        },
    }


class _Inner(BaseModel):
    path: str


class _Outer(BaseModel):
    items: list[_Inner]
    one: _Inner | None = None


class _Tree(BaseModel):
    children: list[_Tree] = []


def test_compact_schema_writes_nested_models_in_place_unless_one_contains_itself() -> None:
    inner = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    assert compact_schema(_Outer.model_json_schema()) == {
        "type": "object",
        "properties": {"items": {"type": "array", "items": inner}, "one": inner},
        "required": ["items"],
    }
    tree = compact_schema(_Tree.model_json_schema())
    assert tree["$defs"]["_Tree"]["properties"]["children"]["items"] == {"$ref": "#/$defs/_Tree"}


def test_a_registry_offers_each_tool_the_schema_it_has_on_its_own() -> None:
    """The registry makes its tools' schemas in one pass of pydantic's generator; each is
    the one its tool gives alone: nested models in place, a model that contains itself
    with only its own definitions, and a tool's own `schema` (delegate's limit) kept."""

    def tool(name: str, model: type[BaseModel]) -> Tool:
        class One(Tool):
            description = f"the {name} tool"
            params = model

            async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
                raise NotImplementedError

        One.name = name
        return One()

    class Limited(Tool):
        name = "limited"
        description = "a tool with a schema of its own"
        params = _Outer

        def schema(self) -> dict[str, Any]:
            schema = super().schema()
            schema["maxProperties"] = 2
            return schema

        async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
            raise NotImplementedError

    tools = [tool("outer", _Outer), tool("tree", _Tree), tool("inner", _Inner), Limited()]
    specs = {s.name: s.parameters for s in ToolRegistry(tools).specs()}
    assert specs == {t.name: t.schema() for t in tools}
    assert set(specs["tree"]["$defs"]) == {"_Tree"}
    assert specs["limited"]["maxProperties"] == 2


class _Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


class _Defaults(BaseModel):
    count: int = 3
    ratio: float = 0.5
    name: str = "x"
    on: bool = False
    maybe: int | None = None
    tags: list[str] = Field(default=["a"])
    mode: _Mode = _Mode.FAST
    where: Path = Path("/tmp")
    nested: _Inner = Field(default_factory=lambda: _Inner(path="n"))


def test_a_tools_schema_writes_defaults_as_pydantic_does() -> None:
    """Parley's schema generator writes a number, string, boolean or null default as it
    is, without pydantic's per-type encoder; every default comes out as pydantic's own."""

    class Defaults(Tool):
        name = "defaults"
        description = "every kind of default"
        params = _Defaults

        async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
            raise NotImplementedError

    assert Defaults().schema() == compact_schema(_Defaults.model_json_schema())
    assert ToolRegistry([Defaults()]).specs()[0].parameters == Defaults().schema()
