"""A loopback HTTP server speaking the OpenAI chat-completions and Anthropic messages
shapes, plus a few plain endpoints for HTTP skills. Records every request it gets."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64


@dataclass
class FakeAPI:
    key: str = "sk-test-123"
    requests: list[dict[str, Any]] = field(default_factory=list)
    fail_next: int | None = None  # answer the next model call with this status
    url: str = ""

    async def _record(self, request: Request) -> dict[str, Any]:
        body = await request.body()
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode(errors="replace")
        entry = {
            "method": request.method,
            "path": request.url.path,
            "query": dict(request.query_params),
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": parsed,
        }
        self.requests.append(entry)
        return entry

    def _fail(self) -> Response | None:
        if self.fail_next is None:
            return None
        code, self.fail_next = self.fail_next, None
        return JSONResponse({"error": {"message": "simulated failure"}}, status_code=code)

    async def openai(self, request: Request) -> Response:
        req = await self._record(request)
        if (failed := self._fail()) is not None:
            return failed
        if req["headers"].get("authorization") != f"Bearer {self.key}":
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        body = req["body"]
        last = body["messages"][-1]["content"]
        if body.get("stream"):
            return _sse(openai_events(body, f"openai says: {last}"))
        if body.get("tools"):
            return JSONResponse(openai_tool_call(body))
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"openai says: {last}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
            }
        )

    async def anthropic(self, request: Request) -> Response:
        req = await self._record(request)
        if (failed := self._fail()) is not None:
            return failed
        h = req["headers"]
        if h.get("x-api-key") != self.key or not h.get("anthropic-version"):
            return JSONResponse({"type": "error", "error": {"message": "bad key"}}, status_code=401)
        body = req["body"]
        last = body["messages"][-1]["content"]
        if body.get("stream"):
            return _sse(anthropic_events(body, f"claude says: {last}"), named=True)
        if body.get("tools"):
            return JSONResponse(anthropic_tool_call(body))
        return JSONResponse(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [{"type": "text", "text": f"claude says: {last}"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 13, "output_tokens": 7},
            }
        )

    async def item(self, request: Request) -> Response:
        req = await self._record(request)
        if req["headers"].get("authorization") != f"Bearer {self.key}":
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return JSONResponse({"data": {"id": request.path_params["item_id"], "query": req["query"]}})

    async def echo(self, request: Request) -> Response:
        req = await self._record(request)
        return JSONResponse(
            {"received": req["body"], "content_type": req["headers"].get("content-type")}
        )

    async def status(self, request: Request) -> Response:
        await self._record(request)
        return Response(
            "nope: " + request.path_params["code"], status_code=int(request.path_params["code"])
        )

    async def image(self, request: Request) -> Response:
        await self._record(request)
        return Response(PNG, media_type="image/png")

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.openai, methods=["POST"]),
                Route("/v1/messages", self.anthropic, methods=["POST"]),
                Route("/items/{item_id}", self.item),
                Route("/echo", self.echo, methods=["POST", "PUT"]),
                Route("/status/{code}", self.status),
                Route("/chart.png", self.image),
            ]
        )


# --- streaming (server-sent events) and tool calls, in each wire format ----------------------


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]


def _sse(events: list[dict[str, Any]], *, named: bool = False) -> StreamingResponse:
    async def gen() -> Any:
        for event in events:
            prefix = f"event: {event['type']}\n" if named else ""
            yield f"{prefix}data: {json.dumps(event)}\n\n".encode()
            await asyncio.sleep(0)
        if not named:
            yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


def openai_events(body: dict[str, Any], text: str) -> list[dict[str, Any]]:
    base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": body["model"]}
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    events += [
        {**base, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
        for w in _words(text)
    ]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
        events.append({**base, "choices": [], "usage": usage})
    return events


def anthropic_events(body: dict[str, Any], text: str) -> list[dict[str, Any]]:
    message = {"id": "msg_s", "type": "message", "role": "assistant", "model": body["model"]}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "usage": {"input_tokens": 13}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
    ]
    events += [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
        for w in _words(text)
    ]
    events += [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 7},
        },
        {"type": "message_stop"},
    ]
    return events


def _first_tool(tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The first tool's name and arguments filled with the names of its required fields."""
    tool = tools[0].get("function") or tools[0]
    schema = tool.get("parameters") or tool.get("input_schema") or {}
    return tool["name"], {k: f"<{k}>" for k in schema.get("required") or []}


def openai_tool_call(body: dict[str, Any]) -> dict[str, Any]:
    name, args = _first_tool(body["tools"])
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    return {
        "id": "chatcmpl-t",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30},
    }


def anthropic_tool_call(body: dict[str, Any]) -> dict[str, Any]:
    name, args = _first_tool(body["tools"])
    return {
        "id": "msg_t",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [
            {"type": "text", "text": "calling a tool"},
            {"type": "tool_use", "id": "toolu_1", "name": name, "input": args},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 23, "output_tokens": 10},
    }


class Running:
    """``async with Running(FakeAPI()) as api:`` — serves on 127.0.0.1:<free port>."""

    def __init__(self, api: FakeAPI) -> None:
        self.api = api
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> FakeAPI:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        config = uvicorn.Config(
            self.api.app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.task = asyncio.create_task(self.server.serve())
        for _ in range(200):
            if self.server.started:
                break
            await asyncio.sleep(0.01)
        self.api.url = f"http://127.0.0.1:{port}"
        return self.api

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None and self.task is not None
        self.server.should_exit = True
        await self.task
