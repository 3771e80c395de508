async def main(data):
    return [data.get("n", 0), 2]
