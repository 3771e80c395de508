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
