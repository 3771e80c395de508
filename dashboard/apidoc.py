"""The API reference page (``docs/api.md``) generated from the OpenAPI document the web
app serves at ``/api/v1/openapi.json``: ``python -m dashboard.apidoc > docs/api.md``
(a test keeps the page current)."""

from __future__ import annotations

import sys
from typing import Any

from pydantic import SecretStr

from dashboard.app import create_app
from jobs.settings import Settings

METHODS = ("get", "post", "put", "patch", "delete")

INTRO = """# HTTP API reference

Generated from the OpenAPI document of `skilljobs web` by `python -m dashboard.apidoc`;
do not edit by hand.

- **Machine-readable:** `GET /api/v1/openapi.json` (OpenAPI 3, behind the token like the rest
  of the API): `curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8000/api/v1/openapi.json`.
  Load it into any OpenAPI viewer or client generator.
- **Authentication:** every route below takes `Authorization: Bearer <token>`. The admin token
  (`SKILLJOBS_API_TOKEN`) may do everything; the read token (`SKILLJOBS_API_READ_TOKEN`) only
  the `GET` routes; a session token only its own session's messages and events.
- **Errors** are an envelope: `{"ok": false, "error": "…", "error_type": "…"}` with the
  HTTP status (401 no or wrong token, 403 not allowed for this token, 404 unknown id, 422 the
  request does not validate, with `problems` when there are several).
- **Times** in job, delivery and audit bodies are Unix epoch seconds (UTC); schedule fire
  times are ISO 8601 with their offset.
"""


def openapi() -> dict[str, Any]:
    """The OpenAPI document, as ``/api/v1/openapi.json`` serves it."""
    app = create_app(Settings(api_token=SecretStr("x" * 32)))
    return app.openapi()


def _type(schema: dict[str, Any]) -> str:
    if not schema:
        return "any"
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    return str(kind)


def _cell(text: object) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    doc = (op.get("description") or "").strip()
    summary = op.get("summary", "")
    lines += [doc if doc else summary, ""]
    params = op.get("parameters") or []
    if params:
        lines += ["| parameter | in | type | required | default | description |"]
        lines += ["|---|---|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            default = schema.get("default")
            lines.append(
                f"| `{p['name']}` | {p['in']} | {_cell(_type(schema))} | "
                f"{'yes' if p.get('required') else 'no'} | "
                f"{'' if default is None else f'`{_cell(default)}`'} | "
                f"{_cell(p.get('description') or schema.get('description'))} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body:
        content = body.get("content", {})
        kinds = ", ".join(f"`{k}`" for k in sorted(content))
        need = "required" if body.get("required") else "optional"
        lines += [f"Request body ({need}): {kinds}.", ""]
    codes = sorted(c for c in op.get("responses", {}) if c != "422")
    if codes:
        lines += ["Responses: " + ", ".join(f"`{c}`" for c in codes) + ".", ""]
    return lines


def _section(path: str) -> str:
    parts = path.removeprefix("/api/v1/").split("/")
    return parts[0] or "other"


def render(doc: dict[str, Any]) -> str:
    """The Markdown page: the routes grouped by their first path segment."""
    groups: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in sorted(doc.get("paths", {}).items()):
        for method in METHODS:
            if method in item:
                groups.setdefault(_section(path), []).append((path, method, item[method]))
    out = [INTRO, "## Contents", ""]
    out += [f"- [{name}](#{name.replace('_', '-')})" for name in sorted(groups)]
    out.append("")
    for name in sorted(groups):
        out += [f"## {name}", ""]
        for path, method, op in groups[name]:
            out += _operation(path, method, op)
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    sys.stdout.write(render(openapi()))


if __name__ == "__main__":  # pragma: no cover
    main()
