"""``POST /api/v1/dispatch`` handed from the guard straight to the dispatcher.

The chat layer's hot path. The guard has already decided on the head, authenticated the
caller and parsed the JSON body (it leaves the parsed value in the scope), so a body that
is a valid ``DispatchBody`` is answered here, without the router, the dependency solver and
a second parse of the body. Everything else — no identity, a body that is not a JSON
object, a field refused — goes on to the FastAPI route, which answers as it always has.
An error raised while dispatching propagates as it would from the route (the app's
handler answers 500)."""

from __future__ import annotations

from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from dashboard.api_jobs import DispatchBody, dispatch_answer
from dashboard.guard import IDENTITY, PARSED_BODY
from dashboard.tokens import Identity
from jobs import jsontext

PATH = "/api/v1/dispatch"


def _json_media(ctype: str) -> bool:
    """The media types FastAPI reads a JSON body from (``application/json``, ``…+json``)."""
    main, _, sub = ctype.split(";", 1)[0].strip().lower().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def render(content: object) -> bytes:
    """JSON as ``JSONResponse`` renders it (compact UTF-8; the answers hold no NaN: result
    envelopes spell non-finite numbers out, ``jobs.envelope``)."""
    return jsontext.dumpb(content)


class DispatchLane:
    """Pure ASGI middleware, inside the guard: see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self._body(scope) if scope["type"] == "http" else None
        if body is None:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        status, answer = await dispatch_answer(body, scope["app"].state, headers)
        payload = render(answer)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-length", str(len(payload)).encode("latin-1")),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    @staticmethod
    def _body(scope: Scope) -> DispatchBody | None:
        """The request's valid dispatch body, or None when the route should answer."""
        if scope["path"] != PATH or scope["method"] != "POST" or "app" not in scope:
            return None
        parsed = scope.get(PARSED_BODY)
        if not isinstance(parsed, dict) or not isinstance(scope.get(IDENTITY), Identity):
            return None
        ctype = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
        if not _json_media(ctype.decode("latin-1")):
            return None
        try:
            return DispatchBody.model_validate(parsed)
        except ValidationError:
            return None
