"""The runner of an in-process Python skill from an untrusted path, inside the sandbox.

The worker starts ``python -I -m jobs.execution.sandbox_runner FD`` under bubblewrap
(``jobs.execution.sandbox``) with one end of a socket pair as ``FD``. Over it travel JSON
lines: the worker sends the run (handler path, entry name, input, context); the runner
imports the handler and calls its entry with the same binding as in the worker (``f()``,
``f(input)``, ``f(input, ctx)``), and sends back how it ended — a result (already a
JSON-safe envelope), an exception (its class names, message and traceback), ``sys.exit``,
or an import failure.

Inside the sandbox the context's live objects are stand-ins that ask the worker:
``call_skill`` (async entries) and ``provider`` (``complete`` / ``tool_call`` / ``stream``)
send a request line and wait for the answer; the worker performs the call bound to the
caller's identity. ``db`` is None and ``db_factory`` raises :class:`NoDatabase`: the
business database is not reachable from the sandbox. Both streams of the skill go to the
process's stderr (the run's log); fd 1 is not the channel, so a print never corrupts it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.abc
import importlib.util
import inspect
import io
import json
import os
import socket
import sys
import traceback
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType, SimpleNamespace
from typing import Any, TypedDict

from jobs.execution import inprocess

NO_DATABASE = (
    "no business database is mapped to this sandboxed skill: ctx.db is None and "
    "db_factory cannot open a session (mark the skill's folder trusted to run it in the "
    "worker with the skills database)"
)


class RunStart(TypedDict):
    """The run the worker sends first: what to import and call, with what."""

    path: str  # the handler file
    name: str
    entry_function: str | None
    input: dict[str, Any]
    ctx: dict[str, Any]  # the subprocess form of the runtime context (JSON)
    sites: list[str]  # the skill's dependency environment, after the platform's packages
    provider: dict[str, Any] | None  # what the skill may know of the role's model
    call_skill: bool
    depth: int  # the call_skill nesting level of this run


class NoDatabase(RuntimeError):
    """``db_factory`` was used inside the sandbox."""


class Refused(RuntimeError):
    """The worker could not perform a request; ``kind``: the class of its error."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(f"{kind}: {message}" if kind else message)
        self.message = message
        self.kind = kind


class Channel:
    """The runner's end of the socket: requests out, answers in (by id)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.task: asyncio.Task[None] | None = None

    def send(self, message: dict[str, Any]) -> None:
        self.writer.write(json.dumps(message, ensure_ascii=False, default=str).encode() + b"\n")

    async def request(self, op: str, **fields: Any) -> Any:
        self.next_id += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        self.send({"id": self.next_id, "op": op, **fields})
        await self.writer.drain()
        return await fut

    async def answers(self) -> None:
        while line := await self.reader.readline():
            msg = json.loads(line)
            fut = self.pending.pop(int(msg.get("id", 0)), None)
            if fut is None or fut.done():
                continue
            if "error" in msg:
                fut.set_exception(Refused(str(msg["error"]), str(msg.get("kind") or "")))
            else:
                fut.set_result(msg.get("value"))
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("the worker closed the skill's channel"))


def _provider() -> ModuleType:
    # lazy: httpx and the model types, which most sandboxed skills never ask for
    from jobs.execution import provider

    return provider


class ProviderProxy:
    """``ctx["provider"]`` inside the sandbox: the worker's model, called through it."""

    def __init__(self, channel: Channel, about: dict[str, Any]) -> None:
        self._channel = channel
        self.provider_name = str(about.get("provider_name") or "")
        self.model = about.get("model")
        self.kind = str(about.get("kind") or "")
        self.last_usage: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<provider {self.provider_name!r} (through the worker)>"

    async def _call(self, method: str, messages: object, kwargs: dict[str, Any]) -> dict[str, Any]:
        provider = _provider()
        try:
            value = await self._channel.request(
                "provider", method=method, messages=_plain(messages), kwargs=_plain(kwargs)
            )
        except Refused as exc:  # the model's own errors keep their class
            if exc.kind in ("ProviderUnavailable", "ConnectionError", "TimeoutError"):
                raise provider.ProviderUnavailable(exc.message) from None
            raise provider.ProviderError(exc.message) from None
        data = value if isinstance(value, dict) else {}
        self.last_usage = {
            "input_tokens": int(data.get("input_tokens") or 0),
            "output_tokens": int(data.get("output_tokens") or 0),
        }
        return data

    async def complete(self, messages: object, **kwargs: Any) -> Any:
        return _provider().CompletionResult(**await self._call("complete", messages, kwargs))

    async def tool_call(self, messages: object, tools: object, **kwargs: Any) -> Any:
        data = await self._call("tool_call", messages, {**kwargs, "tools": tools})
        provider = _provider()
        calls = [provider.ToolCall(**c) for c in data.pop("tool_calls", None) or []]
        return provider.ToolCallResult(**data, tool_calls=calls)

    def stream(self, messages: object, **kwargs: Any) -> Any:
        return _Stream(self, messages, kwargs)


class _Stream:
    """``provider.stream`` through the worker: the whole answer arrives as one chunk."""

    def __init__(self, proxy: ProviderProxy, messages: object, kwargs: dict[str, Any]) -> None:
        self._proxy = proxy
        self._messages = messages
        self._kwargs = kwargs
        self.parts: list[str] = []
        self.stop_reason: str | None = None
        self.usage: dict[str, int] = {"input_tokens": 0, "output_tokens": 0}
        self.done = False

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def __aiter__(self) -> Any:
        return self._chunks()

    async def _chunks(self) -> Any:
        result = await self._proxy.complete(self._messages, **self._kwargs)
        self.stop_reason = result.stop_reason
        self.usage = dict(self._proxy.last_usage)
        self.done = True
        if result.text:
            self.parts.append(result.text)
            yield result.text


def _plain(value: object) -> Any:
    """Messages and options (dataclasses, pydantic models) as JSON-able values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class _CompatFinder(importlib.abc.MetaPathFinder):
    """``backend.infra.providers.base`` for ported skills (``jobs.execution.compat``),
    registered when a skill first imports it: the model types cost an import of their own
    that most skills never need."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != "backend" and not fullname.startswith("backend."):
            return None
        from jobs.execution import compat  # lazy: httpx and the model types (see above)

        compat.install()
        if fullname not in sys.modules:
            return None
        return importlib.util.spec_from_loader(fullname, _Registered())


class _Registered(importlib.abc.Loader):
    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return sys.modules[spec.name]

    def exec_module(self, module: ModuleType) -> None:
        return None


def _no_database(*_args: Any, **_kw: Any) -> Any:
    raise NoDatabase(NO_DATABASE)


def _context(start: RunStart, channel: Channel, is_async: bool) -> dict[str, Any]:
    ctx = dict(start.get("ctx") or {})
    ctx["db"] = None
    ctx["db_factory"] = _no_database
    about = start.get("provider")
    ctx["provider"] = ProviderProxy(channel, about) if isinstance(about, dict) else None
    if is_async and start.get("call_skill"):

        async def call_skill(name: str, input: dict[str, Any] | None = None, **kw: Any) -> Any:
            return await channel.request("call_skill", name=name, input=input, kwargs=_plain(kw))

        call_skill.__dict__["depth"] = int(start.get("depth") or 0)
        ctx["call_skill"] = call_skill
    return ctx


def _raised(exc: BaseException) -> dict[str, Any]:
    types = [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]
    text = "".join(traceback.format_exception(exc))
    return {
        "kind": "raised",
        "type": type(exc).__name__,
        "types": types,
        "message": str(exc),
        "traceback": text,
    }


async def _run(start: RunStart, channel: Channel) -> dict[str, Any]:
    name = str(start.get("name") or "skill")
    path = str(start["path"])
    for site in reversed(start.get("sites") or []):
        sys.path.append(site)  # after the platform's own packages, as in the worker
    sys.argv = [path]
    sys.meta_path.insert(0, _CompatFinder())  # backend.infra.providers.base, on first import
    skill = SimpleNamespace(name=name, entry_function=start.get("entry_function"))
    try:
        entry = inprocess._import_entry(skill, path, 0)
    except SystemExit as exc:
        return {"kind": "exit", "code": _code(exc), "at_import": True}
    except BaseException as exc:
        return {"kind": "import_failed", "message": f"{type(exc).__name__}: {exc}"}
    ctx = _context(start, channel, entry.is_async)
    data = start.get("input") or {}
    args: tuple[Any, ...] = ((), (data,))[min(entry.required, 1)]
    if entry.required >= 2:
        args = (data, ctx)
    try:
        if entry.is_async:
            result = await entry.fn(*args)
        else:
            result = await asyncio.to_thread(entry.fn, *args)
            if inspect.isawaitable(result):
                result = await result
    except NoDatabase as exc:
        return {"kind": "no_database", "message": str(exc)}
    except SystemExit as exc:
        return {"kind": "exit", "code": _code(exc), "at_import": False}
    except BaseException as exc:
        return _raised(exc)
    try:  # a plain JSON value goes as it is (the worker shapes the envelope)
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        # lazy: the envelope imports the database models; most results are plain JSON
        from jobs.envelope import normalize

        result = normalize(result, name)  # dataclasses, dates, decimals, ...
    return {"kind": "result", "value": result}


def _code(exc: SystemExit) -> Any:
    code = exc.code
    return code if code is None or isinstance(code, int | str) else str(code)


async def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 26)
    channel = Channel(reader, writer)
    line = await reader.readline()
    start: RunStart = json.loads(line)["start"]
    channel.task = asyncio.ensure_future(channel.answers())
    done = await _run(start, channel)
    channel.send({"done": done})
    await writer.drain()
    writer.close()


def run() -> None:
    fd = int(sys.argv[1])
    os.dup2(2, 1)  # the skill's stdout joins its stderr: fd 1 is nobody's channel
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # (always, under ``python -I``)
            stream.reconfigure(line_buffering=True)
    asyncio.run(main(fd))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # threads a skill left behind do not hold the run open


if __name__ == "__main__":
    run()
