import json

rows = [
    {"id": i, "customer": f"customer {i}", "total": round(i * 3.5, 2), "paid": i % 2 == 0}
    for i in range(1, 31)
]
print(json.dumps(rows))
