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
from starlette.responses import JSONResponse, Response
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
