"""The OpenAPI document stays behind the token, and docs/api.md is generated from it and
current (regenerate: ``python -m dashboard.apidoc > docs/api.md``)."""

from __future__ import annotations

import httpx
import pytest

from dashboard.apidoc import openapi, render
from tests.helpers.settings import ROOT

pytestmark = pytest.mark.integration


def test_api_reference_page_is_current() -> None:
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert page == render(openapi()), (
        "docs/api.md is out of date: run `python -m dashboard.apidoc > docs/api.md`"
    )
    assert "### `POST /api/v1/skills/{skill}/pause`" in page
    assert "### `DELETE /api/v1/schedules/{schedule_id}`" in page


def test_readme_and_docs_link_the_reference() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/api.md" in readme and "/api/v1/openapi.json" in readme
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert "api.md" in operations and "/api/v1/openapi.json" in operations


@pytest.mark.slow
async def test_openapi_document_needs_the_token(client: httpx.AsyncClient) -> None:
    doc = await client.get("/api/v1/openapi.json")
    assert doc.status_code == 200
    assert "/api/v1/skills/{skill}/resume" in doc.json()["paths"]
    anonymous = await client.get("/api/v1/openapi.json", headers={"authorization": ""})
    assert anonymous.status_code == 401
    for path in ("/openapi.json", "/docs"):
        assert (await client.get(path)).status_code == 404
