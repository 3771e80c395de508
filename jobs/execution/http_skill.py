"""HTTP skills: one request described by a TOML file, sent through the shared httpx client.

The TOML (flat, or under a ``[request]`` table)::

    method = "POST"                      # default GET
    url = "https://api.example.com/v1/items/{item_id}"
    timeout = 30                         # seconds; the skill's wall clock also bounds it
    content_type = "application/json"    # for a string body
    [headers]
    Authorization = "Bearer {api_token}"
    [query]
    lang = "{lang}"
    [body]                               # JSON body; "{x}" alone keeps x's type
    name = "{name}"
    [response]
    path = "data.items"                  # optional: return only this part of the JSON

``{name}`` placeholders are filled from the skill's configs (§5.1 order; never the worker's
environment, never a ``SKILLJOBS_*`` name: a missing one is ``needs_config``), then the input, then ``{workspace}`` / ``{baseDir}``: configs win, so an input
can never replace a configured base URL or token. The scheme, host, port and path prefix of
the URL (everything before the first placeholder the input fills) come only from the TOML
and the configs; input values are quoted into the rest. The request goes through the
outbound policy (public https, or hosts in ``SKILLJOBS_FETCH_ALLOW_HOSTS``) and follows no
redirect. Without ``body``, POST/PUT/PATCH
send the input as JSON; without ``query``, GET/DELETE send the unused scalar inputs as query
parameters. A JSON answer is the result; text becomes ``{"output": ...}``; a media answer is
saved into the workspace.
"""

from __future__ import annotations

import json
import mimetypes
import re
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from delivery.net.fetch import FetchError, SafeFetcher
from delivery.net.urlsafety import RefusedURL
from jobs.context import RESERVED_PREFIX, lookup_config
from jobs.envelope import failure
from jobs.execution.subproc import OUTPUT_CAP
from jobs.media import media_kind
from jobs.skill import Skill

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_\-]*)\}")
_SPEC_CACHE: dict[str, tuple[int, dict[str, Any]]] = {}
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class TemplateError(ValueError):
    def __init__(self, message: str, *, missing: str | None = None) -> None:
        super().__init__(message)
        self.missing = missing  # the configuration value the template lacks


def load_spec(path: Path) -> dict[str, Any]:
    """The request table of the TOML, cached per (path, mtime)."""
    key = str(path)
    mtime = path.stat().st_mtime_ns
    hit = _SPEC_CACHE.get(key)
    if hit and hit[0] == mtime:
        return hit[1]
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    req = data.get("request")
    spec: dict[str, Any] = req if isinstance(req, dict) else data
    if "response" in data and "response" not in spec:
        spec = {**spec, "response": data["response"]}
    if not isinstance(spec.get("url"), str) or not spec["url"].strip():
        raise TemplateError(f"{path.name} declares no url")
    _SPEC_CACHE[key] = (mtime, spec)
    return spec


class _Filler:
    def __init__(self, skill: Skill, input_data: Mapping[str, Any], ctx: Mapping[str, Any]):
        self.skill, self.input, self.ctx = skill, input_data, ctx
        self.used: set[str] = set()
        self.extra = {"workspace": str(ctx.get("workspace_dir") or ""), "baseDir": str(skill.path)}

    def value(self, name: str) -> Any:
        return self.lookup(name)[0]

    def lookup(self, name: str) -> tuple[Any, bool]:
        """(value, came from the input): configs first, so an input never overrides them."""
        v = lookup_config(self.ctx, self.skill.name, name)
        if v is not None:
            return v, False
        if name.upper().startswith(RESERVED_PREFIX):
            raise TemplateError(
                f"the request template needs {{{name}}}: SKILLJOBS_* names are the worker's "
                "own settings and are never handed to a skill",
                missing=name,
            )
        if name in self.input and self.input[name] is not None:
            self.used.add(name)
            return self.input[name], True
        if name in self.extra:
            return self.extra[name], False
        raise TemplateError(
            f"the request template needs {{{name}}}, which is neither in the input nor in "
            f"the skill's configuration (set it with: skilljobs config set ROLE "
            f"{self.skill.name} {name} VALUE)",
            missing=name,
        )

    def text(self, template: str) -> str:
        def sub(m: re.Match[str]) -> str:
            return _as_text(self.value(m.group(1)))

        return _PLACEHOLDER.sub(sub, template)

    def url(self, template: str) -> tuple[str, str]:
        """(the URL, its trusted prefix): the text before the first value the input fills.
        Configured values that are URLs (a base) go in as they are, every other value
        quoted; an input value is always quoted and may not be ``.`` or ``..``."""
        out: list[str] = []
        prefix: str | None = None
        pos = 0
        for m in _PLACEHOLDER.finditer(template):
            out.append(template[pos : m.start()])
            pos = m.end()
            value, from_input = self.lookup(m.group(1))
            text = _as_text(value)
            if from_input:
                if prefix is None:
                    prefix = "".join(out)
                if text.strip() in {".", ".."}:
                    raise TemplateError(f"the input {m.group(1)!r} may not be {text!r}")
                out.append(quote(text, safe=""))
            else:
                out.append(text if "://" in text else quote(text, safe=""))
        out.append(template[pos:])
        whole = "".join(out)
        return whole, whole if prefix is None else prefix

    def deep(self, obj: object) -> Any:
        if isinstance(obj, str):
            m = _PLACEHOLDER.fullmatch(obj.strip())
            return self.value(m.group(1)) if m else self.text(obj)
        if isinstance(obj, dict):
            return {k: self.deep(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.deep(v) for v in obj]
        return obj


def _as_text(v: object) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _check_prefix(url: str, prefix: str) -> None:
    """The input may only fill the URL after its trusted prefix: same scheme, host and port,
    and a path that stays under the prefix's path."""
    want, got = urlsplit(prefix), urlsplit(url)
    if "://" not in prefix or not want.netloc:
        raise TemplateError(
            "the URL's scheme and host must come from the skill's TOML or configuration, "
            "not from the input"
        )
    try:
        final = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise TemplateError(f"invalid URL: {exc}") from exc
    if (got.scheme, got.netloc) != (want.scheme, want.netloc) or final.host != (
        want.hostname or ""
    ):
        raise TemplateError(
            "the input may not change the URL's scheme, host or port "
            f"({want.scheme}://{want.netloc})"
        )
    if "?" not in prefix and not final.path.startswith(want.path):
        raise TemplateError(f"the input may not leave the URL path {want.path!r}")


def _pick(data: object, path: str) -> Any:
    for part in [p for p in path.split(".") if p]:
        if isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            raise TemplateError(f"response.path {path!r}: {part!r} is not in the answer")
    return data


@dataclass
class _Request:
    method: str
    url: str
    headers: dict[str, str]
    params: Any
    timeout: float
    kwargs: dict[str, Any]


def _build(skill: Skill, spec: dict[str, Any], fill: _Filler, wall: float) -> _Request:
    input_data = fill.input
    method = str(spec.get("method") or "GET").upper()
    url, prefix = fill.url(spec["url"])
    _check_prefix(url, prefix)
    headers = {str(k): str(fill.deep(v)) for k, v in (spec.get("headers") or {}).items()}
    params = fill.deep(spec["query"]) if isinstance(spec.get("query"), dict) else None
    kwargs: dict[str, Any] = {}
    if "body" in spec:
        body = fill.deep(spec["body"])
        if isinstance(body, str):
            kwargs["content"] = body.encode()
            headers.setdefault("Content-Type", str(spec.get("content_type") or "text/plain"))
        else:
            kwargs["json"] = body
    elif method in _BODY_METHODS:
        kwargs["json"] = {k: v for k, v in input_data.items() if not k.startswith("_")}
    if params is None and method not in _BODY_METHODS:
        params = {
            k: v
            for k, v in input_data.items()
            if not k.startswith("_") and k not in fill.used and isinstance(v, str | int | float)
        }
    timeout = min(float(spec.get("timeout") or 60.0), wall)
    return _Request(method, url, headers, params or None, timeout, kwargs)


@dataclass
class _Answer:
    status: int
    ctype: str
    encoding: str
    data: bytes


async def _send(
    req: _Request, http: httpx.AsyncClient, fetcher: SafeFetcher | None, where: str, skill: str
) -> _Answer | dict[str, Any]:
    """The answer, read up to the cap; through the outbound policy when a ``fetcher``
    (``delivery.net.fetch.SafeFetcher``) is given, never following a redirect."""
    if fetcher is not None:
        resp = await fetcher.send(
            req.method,
            req.url,
            headers=req.headers,
            params=req.params,
            timeout=req.timeout,
            **req.kwargs,
        )
    else:
        resp = await http.send(
            http.build_request(
                req.method,
                req.url,
                headers=req.headers,
                params=req.params,
                timeout=req.timeout,
                **req.kwargs,
            ),
            stream=True,
            follow_redirects=False,
        )
    try:
        data = bytearray()
        async for chunk in resp.aiter_bytes():
            data += chunk
            if len(data) > OUTPUT_CAP:
                return failure(
                    f"{where} answered with more than {OUTPUT_CAP // (1 << 20)} MB", skill=skill
                )
    finally:
        await resp.aclose()
    ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
    return _Answer(resp.status_code, ctype, resp.encoding or "utf-8", bytes(data))


async def run_http(
    skill: Skill,
    input_data: Mapping[str, Any],
    ctx: Mapping[str, Any],
    http: httpx.AsyncClient,
    *,
    wall: float,
    fetcher: SafeFetcher | None = None,
) -> Any:
    """Send the skill's request; return the raw result (the executor normalizes it)."""
    assert skill.entry is not None
    try:
        spec = load_spec(Path(skill.entry))
        req = _build(skill, spec, _Filler(skill, input_data, ctx), wall)
    except (TemplateError, tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
        missing = getattr(exc, "missing", None)
        extra = {"needs_config": [missing]} if missing else {}
        return failure(
            f"HTTP skill {skill.name!r}: {exc}", error_type="config", skill=skill.name, **extra
        )

    parts = urlsplit(req.url)
    where = f"{req.method} {parts.scheme}://{parts.netloc}{parts.path}"  # never the query
    try:
        answer = await _send(req, http, fetcher, where, skill.name)
    except Exception as exc:
        refused = _policy_refusal(exc, where, skill.name)
        if refused is None:
            raise
        return refused
    if isinstance(answer, dict):
        return answer
    return _result(answer, spec, where, parts.path, ctx, skill.name)


def _policy_refusal(exc: Exception, where: str, skill: str) -> dict[str, Any] | None:
    if isinstance(exc, RefusedURL):
        return failure(
            f"{where} refused by the outbound policy: {exc.reason} (internal APIs need "
            "their host in SKILLJOBS_FETCH_ALLOW_HOSTS)",
            error_type="config",
            non_retriable=True,
            skill=skill,
        )
    if isinstance(exc, FetchError):
        return failure(f"{where}: {exc}", error_type="transient", skill=skill)
    return None


def _result(
    answer: _Answer,
    spec: dict[str, Any],
    where: str,
    url_path: str,
    ctx: Mapping[str, Any],
    skill: str,
) -> Any:
    status, ctype, encoding, data = answer.status, answer.ctype, answer.encoding, answer.data
    if status >= 400:
        snippet = data[:500].decode(encoding, errors="replace").strip()
        kind = (
            "config"
            if status in (401, 403)
            else "transient"
            if status == 429 or status >= 500
            else None
        )
        return failure(
            f"{where} answered HTTP {status}: {snippet or '(empty body)'}",
            error_type=kind,
            status_code=status,
            skill=skill,
        )
    if ctype.startswith(("image/", "video/", "audio/")) or ctype in (
        "application/pdf",
        "application/octet-stream",
        "application/zip",
    ):
        return _save(data, ctype, url_path, ctx)
    text = data.decode(encoding, errors="replace")
    if ctype.endswith("json") or text.lstrip().startswith(("{", "[")):
        try:
            value = json.loads(text)
        except ValueError:
            return {"output": text, "status_code": status}
        path = (spec.get("response") or {}).get("path")
        if path:
            try:
                value = _pick(value, str(path))
            except TemplateError as exc:
                return failure(f"HTTP skill {skill!r}: {exc}", skill=skill)
        return value
    return {"output": text, "status_code": status}


def _save(data: bytes, ctype: str, url_path: str, ctx: Mapping[str, Any]) -> dict[str, Any]:
    ws = ctx.get("workspace_dir")
    if not ws:
        return failure("the HTTP skill answered with a file but this run has no workspace")
    name = Path(url_path).name or "download"
    if not Path(name).suffix:
        name += mimetypes.guess_extension(ctype) or ".bin"
    target = Path(ws) / f"{Path(name).stem}_{secrets.token_hex(3)}{Path(name).suffix}"
    target.write_bytes(data)
    return {
        "ok": True,
        "filename": target.name,
        "local_path": str(target),
        "media": media_kind(target.name),
        "size": len(data),
    }
