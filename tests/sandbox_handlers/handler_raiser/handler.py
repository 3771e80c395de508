def parse_row(row):
    raise ValueError(f"bad ledger row {row}")


def execute(input_data, ctx):
    print("parsing the ledger")
    return parse_row(input_data.get("row", 42))
