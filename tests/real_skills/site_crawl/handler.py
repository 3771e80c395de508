async def execute(input_data, runtime_context):
    budget = int(input_data.get("budget", 50))
    pages = [f"/docs/page-{i}" for i in range(budget)]
    return {
        "success": True,
        "completed": False,
        "warning": f"stopped after {budget} of 120 pages (page budget reached)",
        "message": f"Crawled {budget} pages.",
        "pages": pages,
    }
