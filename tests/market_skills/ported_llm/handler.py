"""Ported as is: imports the provider types from the platform's base module."""

from backend.infra.providers.base import CallOptions, Message

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


async def execute(input_data, ctx):
    provider = ctx.get("provider")
    if provider is None:
        return {
            "success": False,
            "error_type": "config",
            "non_retriable": True,
            "error": "no model configured for this role",
        }
    prompt = input_data["prompt"]
    resp = await provider.complete(
        [Message(role="user", content=prompt)], system="be brief", max_tokens=64, temperature=0.3
    )
    chunks = []
    stream = provider.stream(
        [Message(role="user", content=prompt)], options=CallOptions(max_tokens=32)
    )
    async for chunk in stream:
        chunks.append(chunk)
    called = await provider.tool_call(
        [Message(role="user", content="weather in Paris?")], [WEATHER]
    )
    return {
        "ok": True,
        "text": resp.text,
        "chunks": chunks,
        "stream_usage": dict(provider.last_usage),
        "tool": [(c.name, c.arguments) for c in called.tool_calls],
        "provider_name": provider.provider_name,
    }
