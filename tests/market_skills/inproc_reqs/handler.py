from text_unidecode import unidecode


async def execute(input_data, runtime_context):
    return {"ok": True, "ascii": unidecode(input_data.get("text", ""))}
