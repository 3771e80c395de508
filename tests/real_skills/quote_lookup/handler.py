async def execute(input_data, runtime_context):
    return {"message": f"{input_data['symbol']}: 187.20 USD", "price": 187.2}
