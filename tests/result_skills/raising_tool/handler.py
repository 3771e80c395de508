async def execute(input_data, runtime_context):
    account = input_data.get("account", "?")
    print("loading the ledger for", account)
    raise ValueError(f"account {account!r} is not in the ledger")
