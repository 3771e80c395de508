from __future__ import annotations

import dataclasses
import typing


@dataclasses.dataclass
class Row:
    name: str
    count: int = 0


async def execute(input_data, runtime_context):
    return {
        "ok": True,
        "hints": sorted(typing.get_type_hints(Row)),
        "row": dataclasses.asdict(Row("a")),
    }
