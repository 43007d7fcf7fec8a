"""Every error code the server can answer with is listed in the OpenAPI document's `ErrorCode` enum.

The codes are found in app/ by reading its source: the literal passed as `code` to any function of
app/ that takes one (ProtocolError, bad_request, error_reply, error_body, ...), `Code.X.value`, the
state machine's outcomes as `raise_for` renders them, and hand-written `"code": "..."` JSON.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from app.protocol.responses import _CODES, _ERRORS
from app.state_machine.commands import Code
from tests.openapi.helpers import load_document

APP = Path(__file__).resolve().parents[2] / "app"
# A code spelled out in JSON text, e.g. b'{"error":{"code":"server_busy",...'.
_JSON_CODE = re.compile(r"""\\?["']code\\?["']\s*:\s*\\?["']([a-z][a-z0-9_]*)\\?["']""")


def _modules() -> Iterator[tuple[Path, str, ast.Module]]:
    for path in sorted(APP.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        yield path, source, ast.parse(source, str(path))


def _code_positions(trees: list[ast.Module]) -> dict[str, set[int]]:
    """Callable name -> the positions its `code` parameter may take in a call (a class: its __init__)."""
    positions: dict[str, set[int]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                _add_position(positions, node.name, node)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        _add_position(positions, node.name, item)
    return positions


def _add_position(positions: dict[str, set[int]], name: str, func: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    params = [a.arg for a in func.args.posonlyargs + func.args.args]
    if params and params[0] in ("self", "cls"):
        params = params[1:]  # called bound: self.method(...) or Class(...)
    if "code" in params:
        positions.setdefault(name, set()).add(params.index("code"))


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _code_arguments(call: ast.Call, positions: set[int]) -> Iterator[ast.expr]:
    yield from (k.value for k in call.keywords if k.arg == "code")
    yield from (call.args[i] for i in positions if i < len(call.args))


def _single_query_names(trees: list[ast.Module]) -> set[str]:
    """The parameters read through single_query(params, name), whose repeats are `invalid_{name}`."""
    return {
        node.args[1].value
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _callee(node) == "single_query" and len(node.args) > 1
        if isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
    }


def codes_in_app() -> dict[str, str]:
    """Error code -> where it was found first."""
    modules = list(_modules())
    trees = [tree for _, _, tree in modules]
    positions = _code_positions(trees)
    found: dict[str, str] = {}
    dynamic: list[str] = []
    for path, source, tree in modules:
        where = str(path.relative_to(APP.parent))
        for match in _JSON_CODE.finditer(source):
            found.setdefault(match[1], where)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or _callee(node) not in positions:
                continue
            callee = _callee(node)
            assert callee is not None
            if callee == "bad_request" and len(node.args) < 2 and not node.keywords:
                found.setdefault("bad_request", where)  # its default code
            for arg in _code_arguments(node, positions[callee]):
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.setdefault(arg.value, f"{where}:{node.lineno}")
                elif _is_code_member(arg):
                    found.setdefault(Code[arg.value.attr].value, f"{where}:{node.lineno}")  # type: ignore[attr-defined]
                elif isinstance(arg, ast.JoinedStr):
                    dynamic.append(f"{where}:{node.lineno}")
    # f"invalid_{name}" in single_query is the one code built at run time.
    assert all("headers.py" in place for place in dynamic), f"teach this test the dynamic codes at {dynamic}"
    for name in _single_query_names(trees):
        found.setdefault(f"invalid_{name}", "app/protocol/headers.py (single_query)")
    for outcome in _ERRORS:  # what raise_for turns the state machine's refusals into
        found.setdefault(_CODES.get(outcome, outcome.value), "app/protocol/responses.py (raise_for)")
    return found


def _is_code_member(arg: ast.expr) -> bool:
    """`Code.X.value`."""
    return (
        isinstance(arg, ast.Attribute)
        and arg.attr == "value"
        and isinstance(arg.value, ast.Attribute)
        and isinstance(arg.value.value, ast.Name)
        and arg.value.value.id == "Code"
    )


def documented_codes() -> set[str]:
    return set(load_document()["components"]["schemas"]["ErrorCode"]["enum"])


def test_the_scan_finds_codes_of_every_kind() -> None:
    found = codes_in_app()
    # A literal, a default, Code.X.value, single_query's dynamic codes, raise_for's renaming, error_body.
    expected = ["invalid_stream_id", "bad_request", "snapshot_not_found", "invalid_cursor", "stream_not_found"]
    assert set(expected + ["not_leader", "offset_trimmed"]) <= set(found)
    assert "not_found" in found  # unknown routes (the state machine's not_found is renamed)


def test_every_error_code_in_app_is_in_the_openapi_enum() -> None:
    documented = documented_codes()  # parsed once: the document is large
    missing = {code: where for code, where in codes_in_app().items() if code not in documented}
    assert not missing, f"add these codes to ErrorCode in openapi/rill.yaml: {missing}"


def test_the_error_schema_uses_the_enum() -> None:
    schemas = load_document()["components"]["schemas"]
    code = schemas["Error"]["properties"]["error"]["properties"]["code"]
    assert code["$ref"] == "#/components/schemas/ErrorCode"
    enum = schemas["ErrorCode"]["enum"]
    assert len(enum) == len(set(enum)) and enum == sorted(enum)
    # Every code has its one-line description.
    described = re.findall(r"^\s*\* `([A-Za-z0-9_]+)`", schemas["ErrorCode"]["description"], re.MULTILINE)
    assert sorted(described) == enum
