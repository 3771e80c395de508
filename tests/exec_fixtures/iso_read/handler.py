"""Reads whatever file the input names: the confinement must stop a bad path first."""

from pathlib import Path


def execute(input_data):
    name = (
        input_data.get("path")
        or input_data.get("doc")
        or input_data.get("source_file")
        or input_data.get("image")
    )
    return {"ok": True, "text": Path(name).read_text(errors="replace")[:200]}
