"""Markdown reaches each platform in the dialect it renders (SPEC §6.5, C3): converted by
``delivery.richtext``, sent by the adapters, checked by fakes that parse what the platforms
parse (Telegram's HTML entities, Feishu's card JSON, WeCom/DingTalk markdown messages)."""

from __future__ import annotations

import httpx
import pytest

from delivery import richtext
from delivery.channels.base import DeliveryPermanentError
from delivery.channels.dingtalk import DingTalkChannel
from delivery.channels.feishu import FeishuChannel
from delivery.channels.telegram import TEXT_LIMIT, TelegramChannel
from delivery.channels.wecom import TEXT_BYTES, WeComChannel
from delivery.render import render
from tests.fakes import feishu_card, telegram_html
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.server import Response
from tests.fakes.wecom import FakeWeCom

REPORT = """# Model cost report

Prices from **3 providers** & <b>not html</b>; see [the sheet](https://example.com/s?a=1&b=2).

| model | $/1M in | $/1M out |
|:------|--------:|---------:|
| small | 0.15 | 0.60 |
| 大模型 | 3.00 | 15.00 |

- cheapest: `small`
- dearest: *large*
  - nested note

> Prices change; ~~old~~ figures removed.

```python
if cost < budget:
    print("ok")
```
"""
CLI_OUTPUT = "Found 3 duplicates in /data/photos\nsaved 12_345 bytes, 2 * 3 = 6\n"


@pytest.fixture
async def http():  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client


def test_plain_output_is_not_markdown() -> None:
    assert not richtext.has_markup(CLI_OUTPUT)
    assert not richtext.has_markup("snake_case_names and a_b_c")
    assert richtext.has_markup(REPORT)
    assert richtext.has_markup("**done**") and richtext.has_markup("| a |\n|---|\n| 1 |")


def test_telegram_html_parses_as_telegram_parses_it() -> None:
    (piece,) = richtext.pieces(REPORT, richtext.TELEGRAM, TEXT_LIMIT)
    parsed = telegram_html.parse(piece)
    assert not isinstance(parsed, str), parsed
    shown, entities = parsed
    assert shown.startswith("Model cost report\n\nPrices from 3 providers & <b>not html</b>")
    kinds = {e["type"] for e in entities}
    assert {"bold", "italic", "strikethrough", "code", "pre", "text_link", "blockquote"} <= kinds
    link = next(e for e in entities if e["type"] == "text_link")
    assert link["url"] == "https://example.com/s?a=1&b=2"
    assert shown[link["offset"] : link["offset"] + link["length"]] == "the sheet"
    # the table is a <pre> of aligned columns (CJK counted two cells wide)
    assert "model  | $/1M in | $/1M out\n" in shown
    assert "大模型 |    3.00 |    15.00" in shown
    assert any(e.get("language") == "python" for e in entities)
    assert "• cheapest: small\n• dearest: large\n  • nested note" in shown
    assert 'if cost < budget:\n    print("ok")' in shown


def test_long_markdown_is_cut_between_blocks_within_the_shown_limit() -> None:
    rows = "\n".join(f"| row{i} | {'x' * 40} |" for i in range(400))
    code = "\n".join(f"line {i} <{'y' * 30}>" for i in range(300))
    md = (
        "\n\n".join(f"**Section {i}.** " + "word & " * 60 for i in range(40))
        + f"\n\n| name | value |\n|---|---|\n{rows}\n\n```\n{code}\n```\n"
    )
    pieces = richtext.pieces(md, richtext.TELEGRAM, TEXT_LIMIT)
    assert len(pieces) > 5
    shown = []
    for p in pieces:
        parsed = telegram_html.parse(p)
        assert not isinstance(parsed, str), parsed
        assert richtext.telegram_visible_len(p) <= TEXT_LIMIT
        shown.append(parsed[0])
    text = "\n".join(shown)
    assert text.index("Section 39.") < text.index("row0 ") < text.index("row399 ")
    assert text.index("row399 ") < text.index("line 299 <")
    # a table cut over several messages repeats its header in each
    table_parts = [s for s in shown if "row" in s and "name" in s]
    assert len(table_parts) >= 2 and all(s.startswith("name ") for s in table_parts)


def test_feishu_card_markdown_is_escaped_and_valid() -> None:
    (piece,) = richtext.pieces(REPORT + "\n<at id=all></at>\n", richtext.FEISHU, 25_000)
    card = richtext.feishu_card(piece)
    assert feishu_card.problem(card, 1000) is None
    content = card["body"]["elements"][0]["content"]
    assert "&lt;at id=all&gt;" in content and "<at" not in content  # no @everyone from data
    assert "| model | $/1M in | $/1M out |\n| :-- | --: | --: |" in content
    assert "```python\nif cost < budget:" in content
    assert "[the sheet](https://example.com/s?a=1&b=2)" in content


def test_display_md_stays_markdown_for_channels_that_convert_it() -> None:
    result = {"message": "Report ready", "display_md": "| a | b |\n|---|---|\n| 1 | 2 |"}
    assert render(result, markdown=True).endswith("| a | b |\n|---|---|\n| 1 | 2 |")
    assert "|---|" not in render(result)  # a plain-text channel gets it as text


# --- through the adapters, to the fake platforms ----------------------------------------


async def test_telegram_sends_html_and_plain_text_stays_plain(tg, http) -> None:  # type: ignore[no-untyped-def]
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    await ch.send_text("1001", REPORT)
    await ch.send_text("1001", CLI_OUTPUT)
    rich, plain = tg.sent
    assert rich["parse_mode"] == "HTML" and "<pre>" in rich["html"]
    assert rich["text"].startswith("Model cost report\n\n")
    assert {e["type"] for e in rich["entities"]} >= {"bold", "pre", "text_link"}
    assert "parse_mode" not in plain and plain["text"] == CLI_OUTPUT.strip()


async def test_telegram_refusing_the_entities_gets_plain_text(tg, http) -> None:  # type: ignore[no-untyped-def]
    tg.unsupported_tags = {"blockquote"}  # an older Bot API
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    await ch.send_text("1001", REPORT)
    (sent,) = tg.sent
    assert "parse_mode" not in sent
    assert sent["text"].startswith("Model cost report\n\nPrices from 3 providers & <b>not html</b>")
    assert "> Prices change; old figures removed." in sent["text"]
    failed = [r for r in tg.requests if (r.json or {}).get("parse_mode") == "HTML"]
    assert len(failed) == 1  # tried once as HTML


@pytest.mark.slow
async def test_telegram_long_markdown_arrives_whole_in_order(tg, http) -> None:  # type: ignore[no-untyped-def]
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    md = "\n\n".join(f"## Part {i}\n\n" + "**x** & y " * 120 for i in range(20))
    await ch.send_text("1001", md)
    assert len(tg.sent) > 2 and all(s["parse_mode"] == "HTML" for s in tg.sent)
    shown = "\n".join(s["text"] for s in tg.sent)
    assert [f"Part {i}" in shown for i in range(20)] == [True] * 20
    assert shown.index("Part 3") < shown.index("Part 17")


async def test_feishu_sends_an_interactive_card(fs, http) -> None:  # type: ignore[no-untyped-def]
    ch = FeishuChannel(http, fs.app_id, fs.app_secret, api_base=fs.url)
    await ch.send_text("ou_1", REPORT)
    await ch.send_text("ou_1", CLI_OUTPUT)
    card, text = fs.sent
    assert card["msg_type"] == "interactive" and card["content"]["schema"] == "2.0"
    assert card["content"]["body"]["elements"][0]["tag"] == "markdown"
    assert card["content"]["config"]["summary"]["content"] == "Model cost report"
    assert text["msg_type"] == "text" and text["content"] == {"text": CLI_OUTPUT}


@pytest.mark.slow
async def test_wecom_markdown_messages_within_2048_bytes(http) -> None:  # type: ignore[no-untyped-def]
    with FakeWeCom() as wc:
        ch = WeComChannel(http, wc.corp_id, wc.corp_secret, str(wc.agent_id), api_base=wc.url)
        await ch.send_text("zhangsan", REPORT * 12)
        assert len(wc.sent) > 1 and {s["msgtype"] for s in wc.sent} == {"markdown"}
        for s in wc.sent:
            content = s["markdown"]["content"]
            assert len(content.encode()) <= TEXT_BYTES
        first = wc.sent[0]["markdown"]["content"]
        assert first.startswith("# Model cost report\n\nPrices from **3 providers**")
        assert "`if cost < budget:`" in first  # no code blocks in WeCom: lines as code


async def test_dingtalk_sample_markdown_with_a_title(http) -> None:  # type: ignore[no-untyped-def]
    with FakeDingTalk() as dt:
        ch = DingTalkChannel(
            http, dt.app_key, dt.app_secret, dt.robot_code, api_base=dt.url, oapi_base=dt.oapi.url
        )
        await ch.send_text("user001", REPORT)
        await ch.send_text("user001", "plain words")
        md, plain = dt.sent
        assert md["msgKey"] == "sampleMarkdown"
        assert md["msgParam"]["title"] == "Model cost report"
        assert md["msgParam"]["text"].startswith("# Model cost report\n\n")
        assert "*large*" in md["msgParam"]["text"]
        assert plain["msgKey"] == "sampleText"


@pytest.mark.slow
async def test_telegram_markdown_caption_goes_as_html(tg, http, tmp_path) -> None:  # type: ignore[no-untyped-def]
    photo = tmp_path / "chart.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    await ch.send_image("1001", str(photo), "**Weekly chart** for <team> & co")
    tg.unsupported_tags = {"b"}
    await ch.send_image("1001", str(photo), "**Weekly chart** again")
    html_one, plain_one = tg.sent
    assert (
        html_one["parse_mode"] == "HTML" and html_one["caption"] == "Weekly chart for <team> & co"
    )
    assert html_one["caption_entities"] == [{"type": "bold", "offset": 0, "length": 12}]
    assert "parse_mode" not in plain_one and plain_one["caption"] == "Weekly chart again"


async def test_feishu_card_refused_goes_as_text(fs, http) -> None:  # type: ignore[no-untyped-def]
    ch = FeishuChannel(http, fs.app_id, fs.app_secret, api_base=fs.url)
    refused = Response(400, {"code": 230099, "msg": "Failed to create card content"})
    fs.fail_next("/open-apis/im/v1/messages", refused)
    await ch.send_text("ou_1", REPORT)
    (sent,) = fs.sent
    assert sent["msg_type"] == "text"
    assert sent["content"]["text"].startswith("Model cost report\n\nPrices from 3 providers")
    # any other refusal is the send's failure, not a reason to send it differently
    fs.fail_next("/open-apis/im/v1/messages", Response(400, {"code": 230002, "msg": "no bot"}))
    with pytest.raises(DeliveryPermanentError, match="230002"):
        await ch.send_text("ou_1", REPORT)
    assert len(fs.sent) == 1


# Pieces of Markdown and of text that looks like it, combined at random (seeded): whatever a
# skill prints, every message parses as Telegram parses it, fits, and shows every word.
ATOMS = (
    "**", "*", "_", "__", "`", "[", "]", "(", ")", "https://a.b/c?x=1&y=2", "<", ">", "&",
    "&amp;", "\n", "\n\n", "# ", "- ", "1. ", "> ", "|", "---", "    ", "word", "词", "😀",
    "![", "\\", "<b>", "javascript:alert(1)", "\t", "+ ", "===", '"', "'",
)  # fmt: skip


@pytest.mark.parametrize("limit", [60, 300, TEXT_LIMIT])
@pytest.mark.slow
def test_any_text_converts_to_valid_html_within_the_limit(limit: int) -> None:
    import random

    rnd = random.Random(limit)
    for _ in range(300):
        src = "".join(rnd.choice(ATOMS) for _ in range(rnd.randint(1, 120)))
        shown = []
        for piece in richtext.pieces(src, richtext.TELEGRAM, limit):
            parsed = telegram_html.parse(piece)
            assert not isinstance(parsed, str), (src, piece, parsed)
            assert richtext.telegram_visible_len(piece) <= limit, src
            shown.append(parsed[0])
        for word in ("word", "词", "😀"):
            assert "".join(shown).count(word) == src.count(word), (src, shown)
        for dialect in (richtext.FEISHU, richtext.WECOM, richtext.DINGTALK):
            assert all(dialect.size(p) <= limit for p in richtext.pieces(src, dialect, limit))


async def test_wecom_markdown_refused_as_a_type_goes_as_text(http) -> None:  # type: ignore[no-untyped-def]
    with FakeWeCom() as wc:
        ch = WeComChannel(http, wc.corp_id, wc.corp_secret, str(wc.agent_id), api_base=wc.url)
        refused = Response(200, {"errcode": 40008, "errmsg": "invalid message type"})
        wc.fail_next("/cgi-bin/message/send", refused)
        await ch.send_text("zhangsan", REPORT)
        (sent,) = wc.sent
        assert sent["msgtype"] == "text"
        assert sent["text"]["content"].startswith("Model cost report\n\nPrices from 3 providers")
