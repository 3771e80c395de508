"""Import names that ported skills use, served for skill code only.

Skills written for the platform the seeds describe import the provider types as
``from backend.infra.providers.base import Message`` (seed §10.1). The executor registers
that module — and its parents — in ``sys.modules`` when it first runs in-process skill
code, so such a skill imports unchanged; the distribution ships no ``backend`` package,
and nothing outside skill code sees the name until then. A real ``backend`` package that
is already imported is left alone.
"""

from __future__ import annotations

import sys
import types

from jobs.execution import provider

PROVIDER_BASE = "backend.infra.providers.base"
EXPORTS = (
    "CallOptions",
    "CompletionResult",
    "LLMProvider",
    "Message",
    "ProviderError",
    "ProviderUnavailable",
    "TextStream",
    "ToolCall",
    "ToolCallResult",
)


def install() -> None:
    """Register ``backend.infra.providers.base`` (idempotent, cheap after the first call)."""
    if PROVIDER_BASE in sys.modules:
        return

    parts = PROVIDER_BASE.split(".")
    parent: types.ModuleType | None = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        module = sys.modules.get(name)
        if module is None:
            module = types.ModuleType(name, "skill compatibility module (skilljobs)")
            if depth < len(parts):
                module.__path__ = []  # a package: its child is importable
            sys.modules[name] = module
        if parent is not None:
            setattr(parent, parts[depth - 1], module)
        parent = module
    assert parent is not None
    for export in EXPORTS:
        setattr(parent, export, getattr(provider, export))
    parent.__dict__["__all__"] = list(EXPORTS)
