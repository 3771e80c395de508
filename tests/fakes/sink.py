"""A webhook sink: accepts any POST, records it, answers 200 (or what a test scripts)."""

from __future__ import annotations

import asyncio

from tests.fakes.server import FakeServer, Request, Response


class FakeSink(FakeServer):
    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.route("POST", "/*", self._accept)

    async def _accept(self, req: Request) -> Response:
        if self.delay:
            await asyncio.sleep(self.delay)
        return Response(200, {"status": "ok"})


class FakeFiles(FakeServer):
    """Serves registered files over GET (a stand-in for a CDN), with their content type."""

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, tuple[bytes, str]] = {}
        self.route("GET", "/*", self._get)
        self.route("HEAD", "/*", self._get)

    async def _get(self, req: Request) -> Response:
        if req.path not in self.files:
            return Response(404, "not found", {"content-type": "text/plain"})
        body, ctype = self.files[req.path]
        headers = {"content-type": ctype, "content-length": str(len(body))}
        return Response(200, body if req.method == "GET" else b"", headers)
