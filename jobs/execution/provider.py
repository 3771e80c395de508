"""The LLM provider skills get as ``ctx["provider"]``, and the LLM variables subprocess
skills get instead (SPEC §2, skill spec §10).

Two wire protocols through httpx: OpenAI-compatible ``POST {base}/v1/chat/completions``
(every ``SKILLJOBS_LLM_PROVIDER`` other than ``anthropic``) and Anthropic
``POST {base}/v1/messages``. The surface is the one the skill spec documents (seed §10.1):
``complete()``, ``stream()`` (text chunks, usage once it ends), ``tool_call()``, and the
attributes ``model`` / ``provider_name`` / ``last_usage``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from jobs.settings import Settings

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_BASES = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com"}


class ProviderError(RuntimeError):
    """The model answered with an error that a retry will not fix (bad request, auth)."""


class ProviderUnavailable(ConnectionError):
    """The model could not be reached or is overloaded (transport error, 429, 5xx)."""


@dataclass
class Message:
    role: str
    content: str


@dataclass
class CallOptions:
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None


@dataclass
class CompletionResult:
    text: str
    stop_reason: str | None
    input_tokens: int
    output_tokens: int
    model: str = ""
    raw: dict[str, Any] | None = None


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class ToolCallResult(CompletionResult):
    """A completion that may ask for tools: ``tool_calls`` in the order the model gave."""

    tool_calls: list[ToolCall] = field(default_factory=list)


def _strip_v1(base: str) -> str:
    base = base.strip().rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def _with_v1(base: str) -> str:
    return _strip_v1(base) + "/v1"


def _kind(provider: str | None) -> str:
    return "anthropic" if (provider or "").strip().lower() == "anthropic" else "openai"


LLMValues = dict[str, str]  # provider, base, key, model


def llm_values(settings: Settings) -> LLMValues:
    """The deployment default model from ``SKILLJOBS_LLM_*``."""
    return {
        "provider": settings.llm_provider or "",
        "base": settings.llm_base or "",
        "key": settings.llm_key.get_secret_value() if settings.llm_key else "",
        "model": settings.llm_model or "",
    }


def role_llm_values(default: LLMValues, role_config: dict[str, Any]) -> LLMValues:
    """A role's binding (``provider``, ``base``, ``key``/``api_key``, ``model`` configured
    under the reserved name ``@llm``) over the default. Binding another provider without
    its own key or base does not inherit the default's: they belong to the other service."""
    role = {k: str(v).strip() for k, v in role_config.items() if v not in (None, "")}
    if "api_key" in role and "key" not in role:
        role["key"] = role["api_key"]
    if not any(k in role for k in ("provider", "base", "key", "model")):
        return default
    values = dict(default)
    if (
        role.get("provider")
        and role["provider"].lower() != (default["provider"] or "openai").lower()
    ):
        values.update(base="", key="")
    values.update({k: role[k] for k in ("provider", "base", "key", "model") if k in role})
    return values


def llm_env(values: LLMValues) -> dict[str, str]:
    """``OPENAI_*`` (base + ``/v1``) or ``ANTHROPIC_*`` (bare base) plus ``MYINC_LLM_KEY``,
    ``MYINC_LLM_BASE`` (openai branch with ``/v1``, anthropic bare) and ``MYINC_LLM_MODEL``.
    A model with no key injects nothing."""
    key = values.get("key") or ""
    if not key:
        return {}
    base = (values.get("base") or "").strip()
    env: dict[str, str] = {"MYINC_LLM_KEY": key}
    if _kind(values.get("provider")) == "anthropic":
        env["ANTHROPIC_API_KEY"] = key
        if base:
            bare = base.rstrip("/")
            env["ANTHROPIC_BASE_URL"] = bare
            env["MYINC_LLM_BASE"] = bare
    else:
        env["OPENAI_API_KEY"] = key
        if base:
            env["OPENAI_BASE_URL"] = env["MYINC_LLM_BASE"] = _with_v1(base)
    if values.get("model"):
        env["MYINC_LLM_MODEL"] = values["model"]
    return env


def subprocess_llm_env(settings: Settings) -> dict[str, str]:
    """The LLM variables a subprocess skill gets for the deployment default model."""
    return llm_env(llm_values(settings))


def _message(m: object) -> dict[str, Any]:
    if isinstance(m, Mapping):
        return {"role": str(m.get("role") or "user"), "content": m.get("content", "")}
    return {"role": str(getattr(m, "role", "user")), "content": getattr(m, "content", str(m))}


def _opt(options: CallOptions | Mapping[str, object] | None, name: str) -> Any:
    if options is None:
        return None
    if isinstance(options, Mapping):
        return options.get(name)
    return getattr(options, name, None)


def _tool_spec(tool: object) -> tuple[str, str, dict[str, Any]]:
    """(name, description, JSON schema) of a tool given in either wire shape or plainly
    as ``{name, description, parameters | input_schema}``."""
    t: dict[str, Any] = dict(tool) if isinstance(tool, Mapping) else {"name": str(tool)}
    if isinstance(t.get("function"), Mapping):  # OpenAI {"type": "function", "function": …}
        t = dict(t["function"])
    schema = t.get("parameters") or t.get("input_schema") or {"type": "object", "properties": {}}
    return str(t.get("name") or ""), str(t.get("description") or ""), dict(schema)


def _tool_arguments(raw: object) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    text = raw or "{}"
    if not isinstance(text, str | bytes | bytearray):
        return {"_raw": raw}
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"_raw": raw}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


class TextStream:
    """``async for chunk in provider.stream(...)``: the text as it arrives. Once the
    iteration ends, ``text``, ``stop_reason`` and ``usage`` (also the provider's
    ``last_usage``) hold the whole answer."""

    def __init__(self, provider: Provider, events: AsyncIterator[dict[str, Any]]) -> None:
        self._provider = provider
        self._events = events
        self.parts: list[str] = []
        self.stop_reason: str | None = None
        self.usage: dict[str, int] = {"input_tokens": 0, "output_tokens": 0}
        self.done = False

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[str]:
        anthropic = self._provider.kind == "anthropic"
        async for event in self._events:
            chunk = self._anthropic(event) if anthropic else self._openai(event)
            if chunk:
                self.parts.append(chunk)
                yield chunk
        self.done = True
        self._provider.last_usage = dict(self.usage)

    def _openai(self, event: dict[str, Any]) -> str:
        usage = event.get("usage")
        if isinstance(usage, Mapping):
            self.usage = {
                "input_tokens": int(usage.get("prompt_tokens") or 0),
                "output_tokens": int(usage.get("completion_tokens") or 0),
            }
        for choice in event.get("choices") or []:
            if choice.get("finish_reason"):
                self.stop_reason = choice["finish_reason"]
            return str((choice.get("delta") or {}).get("content") or "")
        return ""

    def _anthropic(self, event: dict[str, Any]) -> str:
        kind = event.get("type")
        if kind == "message_start":
            usage = (event.get("message") or {}).get("usage") or {}
            self.usage["input_tokens"] = int(usage.get("input_tokens") or 0)
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                return str(delta.get("text") or "")
        elif kind == "message_delta":
            self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
            usage = event.get("usage") or {}
            self.usage["output_tokens"] = int(usage.get("output_tokens") or 0)
        elif kind == "error":
            err = event.get("error") or {}
            msg = f"{self._provider.provider_name} model stream failed: {err.get('message') or err}"
            if err.get("type") in ("overloaded_error", "api_error", "rate_limit_error"):
                raise ProviderUnavailable(msg)
            raise ProviderError(msg)
        return ""


class Provider:
    """``await complete(messages, *, system, max_tokens, temperature, options)``,
    ``async for chunk in stream(...)``, ``await tool_call(messages, tools, ...)``."""

    def __init__(
        self,
        *,
        provider: str,
        base: str,
        key: str,
        model: str,
        http: httpx.AsyncClient | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.provider_name = (provider or "openai").strip().lower()
        self.kind = _kind(provider)
        self.base = _strip_v1(base or DEFAULT_BASES[self.kind])
        self._key = key
        self.model = model
        self._http = http
        self._own_http: httpx.AsyncClient | None = None
        self.timeout = timeout
        self.last_usage: dict[str, int] = {}

    def __repr__(self) -> str:  # never the key
        return f"Provider({self.provider_name!r}, model={self.model!r}, base={self.base!r})"

    def _client(self) -> httpx.AsyncClient:
        if self._http is not None:
            return self._http
        if self._own_http is None:
            self._own_http = httpx.AsyncClient(timeout=self.timeout)
        return self._own_http

    async def aclose(self) -> None:
        if self._own_http is not None:
            await self._own_http.aclose()
            self._own_http = None

    # --- the surface skills call ------------------------------------------------------------

    async def complete(
        self,
        messages: Sequence[Any] | str,
        *,
        system: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        options: CallOptions | Mapping[str, object] | None = None,
    ) -> CompletionResult:
        path, body, headers = self._request(messages, system, max_tokens, temperature, options)
        data = await self._post(path, body, headers)
        result: CompletionResult = self._parse(data, body["model"], CompletionResult)
        self._note_usage(result)
        return result

    def stream(
        self,
        messages: Sequence[Any] | str,
        *,
        system: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        options: CallOptions | Mapping[str, object] | None = None,
    ) -> TextStream:
        """The answer in text chunks as the model produces them (server-sent events)."""
        path, body, headers = self._request(messages, system, max_tokens, temperature, options)
        body["stream"] = True
        if self.kind == "openai":
            body["stream_options"] = {"include_usage": True}
        return TextStream(self, self._events(path, body, headers))

    async def tool_call(
        self,
        messages: Sequence[Any] | str,
        tools: Sequence[Any],
        *,
        system: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        options: CallOptions | Mapping[str, object] | None = None,
        tool_choice: str | None = None,
    ) -> ToolCallResult:
        """A completion that may call ``tools`` (OpenAI ``function`` tools, Anthropic
        tools, or ``{name, description, parameters}``). ``tool_choice``: ``"auto"``
        (default), ``"required"`` / ``"any"``, ``"none"`` or a tool's name."""
        path, body, headers = self._request(messages, system, max_tokens, temperature, options)
        specs = [_tool_spec(t) for t in tools]
        if self.kind == "anthropic":
            body["tools"] = [{"name": n, "description": d, "input_schema": s} for n, d, s in specs]
        else:
            body["tools"] = [
                {"type": "function", "function": {"name": n, "description": d, "parameters": s}}
                for n, d, s in specs
            ]
        if tool_choice:
            body["tool_choice"] = self._tool_choice(tool_choice, {n for n, _, _ in specs})
        data = await self._post(path, body, headers)
        result: ToolCallResult = self._parse(data, body["model"], ToolCallResult)
        self._note_usage(result)
        return result

    # --- wire formats -----------------------------------------------------------------------

    def _request(
        self,
        messages: Sequence[Any] | str,
        system: str | None,
        max_tokens: int,
        temperature: float | None,
        options: CallOptions | Mapping[str, object] | None,
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        if isinstance(messages, str):
            messages = [Message("user", messages)]
        msgs = [_message(m) for m in messages]
        model = _opt(options, "model") or self.model
        if not model:
            raise ProviderError("no model configured: set SKILLJOBS_LLM_MODEL")
        max_tokens = _opt(options, "max_tokens") or max_tokens
        t = _opt(options, "temperature")
        temperature = t if t is not None else temperature
        if self.kind == "anthropic":
            sys_parts = [m["content"] for m in msgs if m["role"] == "system"]
            msgs = [m for m in msgs if m["role"] != "system"]
            if system:
                sys_parts.insert(0, system)
            body: dict[str, Any] = {"model": model, "messages": msgs, "max_tokens": max_tokens}
            if sys_parts:
                body["system"] = "\n\n".join(str(s) for s in sys_parts)
            headers = {"x-api-key": self._key, "anthropic-version": ANTHROPIC_VERSION}
            path = "/v1/messages"
        else:
            if system:
                msgs = [{"role": "system", "content": system}, *msgs]
            body = {"model": model, "messages": msgs, "max_tokens": max_tokens}
            headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
            path = "/v1/chat/completions"
        if temperature is not None:
            body["temperature"] = temperature
        return path, body, headers

    def _tool_choice(self, choice: str, names: set[str]) -> Any:
        c = choice.strip()
        if self.kind == "anthropic":
            if c in names:
                return {"type": "tool", "name": c}
            return {"type": {"required": "any", "none": "none"}.get(c, c)}
        if c in names:
            return {"type": "function", "function": {"name": c}}
        return {"any": "required"}.get(c, c)

    def _parse(self, data: dict[str, Any], model: str, cls: type[Any]) -> Any:
        if self.kind == "anthropic":
            blocks = [b for b in data.get("content") or [] if isinstance(b, dict)]
            text = "".join(str(b.get("text") or "") for b in blocks if b.get("type") == "text")
            calls = [
                ToolCall(
                    str(b.get("id") or ""),
                    str(b.get("name") or ""),
                    _tool_arguments(b.get("input")),
                )
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            usage = data.get("usage") or {}
            stop, tin, tout = (
                data.get("stop_reason"),
                usage.get("input_tokens"),
                usage.get("output_tokens"),
            )
        else:
            choice = (data.get("choices") or [{}])[0]
            message = choice.get("message") or {}
            text = str(message.get("content") or "")
            calls = [
                ToolCall(
                    str(c.get("id") or ""),
                    str((c.get("function") or {}).get("name") or ""),
                    _tool_arguments((c.get("function") or {}).get("arguments")),
                )
                for c in message.get("tool_calls") or []
                if isinstance(c, dict)
            ]
            usage = data.get("usage") or {}
            stop = choice.get("finish_reason")
            tin, tout = usage.get("prompt_tokens"), usage.get("completion_tokens")
        result = cls(
            text=text,
            stop_reason=stop,
            input_tokens=int(tin or 0),
            output_tokens=int(tout or 0),
            model=str(data.get("model") or model),
            raw=data,
        )
        if isinstance(result, ToolCallResult):
            result.tool_calls = calls
        return result

    def _note_usage(self, result: CompletionResult) -> None:
        self.last_usage = {
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
        }

    # --- transport --------------------------------------------------------------------------

    def _status_error(self, status: int, detail: str) -> Exception:
        msg = f"{self.provider_name} model at {self.base} answered HTTP {status}: {detail}"
        if status == 429 or status >= 500:
            return ProviderUnavailable(msg)
        return ProviderError(msg)

    async def _post(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        url = self.base + path
        try:
            resp = await self._client().post(url, json=body, headers=headers, timeout=self.timeout)
        except httpx.TransportError as exc:
            raise ProviderUnavailable(
                f"{self.provider_name} model at {self.base}: {exc!r}"
            ) from exc
        if resp.status_code >= 400:
            raise self._status_error(resp.status_code, resp.text[:300].strip())
        try:
            data = resp.json()
        except ValueError as exc:
            raise ProviderError(
                f"{self.provider_name} model at {self.base} answered non-JSON"
            ) from exc
        if not isinstance(data, dict):
            raise ProviderError(
                f"{self.provider_name} model at {self.base} answered {type(data).__name__}"
            )
        return data

    async def _events(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[dict[str, Any]]:
        """The JSON payloads of a server-sent-events answer (``data:`` lines)."""
        url = self.base + path
        try:
            async with self._client().stream(
                "POST", url, json=body, headers=headers, timeout=self.timeout
            ) as resp:
                if resp.status_code >= 400:
                    detail = (await resp.aread()).decode(errors="replace")[:300].strip()
                    raise self._status_error(resp.status_code, detail)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        return
                    try:
                        event = json.loads(payload)
                    except ValueError as exc:
                        raise ProviderError(
                            f"{self.provider_name} model at {self.base} streamed non-JSON"
                        ) from exc
                    if isinstance(event, dict):
                        yield event
        except httpx.TransportError as exc:
            raise ProviderUnavailable(
                f"{self.provider_name} model at {self.base}: {exc!r}"
            ) from exc


LLMProvider = Provider  # the name the skill spec's base module uses


def provider_from(values: LLMValues, http: httpx.AsyncClient | None = None) -> Provider | None:
    """A provider for these values; None when nothing is configured."""
    if not any(values.get(k) for k in ("provider", "base", "key", "model")):
        return None
    return Provider(
        provider=values.get("provider") or "openai",
        base=values.get("base") or "",
        key=values.get("key") or "",
        model=values.get("model") or "",
        http=http,
    )


def build_provider(settings: Settings, http: httpx.AsyncClient | None = None) -> Provider | None:
    """The default provider from ``SKILLJOBS_LLM_*``; None when no model is configured."""
    return provider_from(llm_values(settings), http)
