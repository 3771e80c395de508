"""Reports the paths it received and whether they exist."""

import os


async def execute(input_data, runtime_context):
    image = input_data.get("image", "")
    return {
        "ok": True,
        "input": input_data,
        "image_exists": os.path.isfile(image),
    }
