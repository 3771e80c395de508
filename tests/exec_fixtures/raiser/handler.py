import asyncio


async def execute(input_data, runtime_context):
    kind = input_data.get("kind")
    if kind == "conn":
        raise ConnectionError("upstream reset")
    if kind == "oserror":
        raise OSError(5, "I/O error")
    if kind == "timeout":
        raise TimeoutError("db pool timeout")
    if kind == "sqlalchemy":
        from sqlalchemy.exc import OperationalError

        raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    if kind == "cancel_self":
        raise asyncio.CancelledError()
    if kind == "exit":
        raise KeyboardInterrupt()
    raise ValueError("boom: bad row 7")
