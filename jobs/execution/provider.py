"""The LLM provider skills get as ``ctx["provider"]``, and the LLM variables subprocess
skills get instead (SPEC §2, skill spec §10).

Two wire protocols through httpx: OpenAI-compatible ``POST {base}/v1/chat/completions``
(every ``SKILLJOBS_LLM_PROVIDER`` other than ``anthropic``) and Anthropic
``POST {base}/v1/messages``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


def _message(m: Any) -> dict[str, Any]:
    if isinstance(m, Mapping):
        return {"role": str(m.get("role") or "user"), "content": m.get("content", "")}
    return {"role": str(getattr(m, "role", "user")), "content": getattr(m, "content", str(m))}


def _opt(options: Any, name: str) -> Any:
    if options is None:
        return None
    if isinstance(options, Mapping):
        return options.get(name)
    return getattr(options, name, None)


class Provider:
    """``await complete(messages, *, system, max_tokens, temperature, options)``."""

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

    async def complete(
        self,
        messages: Sequence[Any] | str,
        *,
        system: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        options: Any = None,
    ) -> CompletionResult:
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
            result = await self._anthropic(msgs, system, model, max_tokens, temperature)
        else:
            result = await self._openai(msgs, system, model, max_tokens, temperature)
        self.last_usage = {
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
        }
        return result

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
            detail = resp.text[:300].strip()
            msg = f"{self.provider_name} model at {self.base} answered HTTP {resp.status_code}: {detail}"
            if resp.status_code == 429 or resp.status_code >= 500:
                raise ProviderUnavailable(msg)
            raise ProviderError(msg)
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

    async def _openai(
        self,
        msgs: list[dict[str, Any]],
        system: str | None,
        model: str,
        max_tokens: int,
        temperature: float | None,
    ) -> CompletionResult:
        if system:
            msgs = [{"role": "system", "content": system}, *msgs]
        body: dict[str, Any] = {"model": model, "messages": msgs, "max_tokens": max_tokens}
        if temperature is not None:
            body["temperature"] = temperature
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        data = await self._post("/v1/chat/completions", body, headers)
        choice = (data.get("choices") or [{}])[0]
        usage = data.get("usage") or {}
        result = CompletionResult(
            text=str((choice.get("message") or {}).get("content") or ""),
            stop_reason=choice.get("finish_reason"),
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            model=str(data.get("model") or model),
            raw=data,
        )
        return result

    async def _anthropic(
        self,
        msgs: list[dict[str, Any]],
        system: str | None,
        model: str,
        max_tokens: int,
        temperature: float | None,
    ) -> CompletionResult:
        sys_parts = [m["content"] for m in msgs if m["role"] == "system"]
        msgs = [m for m in msgs if m["role"] != "system"]
        if system:
            sys_parts.insert(0, system)
        body: dict[str, Any] = {"model": model, "messages": msgs, "max_tokens": max_tokens}
        if sys_parts:
            body["system"] = "\n\n".join(str(s) for s in sys_parts)
        if temperature is not None:
            body["temperature"] = temperature
        data = await self._post(
            "/v1/messages", body, {"x-api-key": self._key, "anthropic-version": ANTHROPIC_VERSION}
        )
        text = "".join(
            str(b.get("text") or "")
            for b in data.get("content") or []
            if isinstance(b, dict) and b.get("type") == "text"
        )
        usage = data.get("usage") or {}
        result = CompletionResult(
            text=text,
            stop_reason=data.get("stop_reason"),
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            model=str(data.get("model") or model),
            raw=data,
        )
        return result


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
