"""The one media table: every part of the product gives a file the same kind."""

from __future__ import annotations

import pytest

from jobs.execution import skill_output
from jobs.media import media_kind, media_of, mime_from_name


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("chart.png", "image"),
        ("photo.JPG", "image"),
        ("anim.gif", "image"),
        ("logo.svg", "file"),  # not a photo to any chat platform
        ("shot.heic", "file"),
        ("scan.tif", "file"),
        ("scan.tiff", "file"),
        ("pic.avif", "file"),
        ("clip.mp4", "video"),
        ("old.flv", "file"),
        ("talk.mp3", "audio"),
        ("voice.ogg", "audio"),
        ("report.pdf", "file"),
        ("data.bin", "file"),
        ("https://cdn.example/a.png?sig=1", "image"),
    ],
)
def test_one_kind_per_extension_everywhere(name: str, kind: str) -> None:
    assert media_kind(name) == kind
    assert skill_output.media_kind(name) == kind  # what a subprocess skill's MEDIA: line gets
    if "?" not in name:
        assert media_of(mime_from_name(name)) == kind  # what a downloaded file gets


def test_declared_kind_wins() -> None:
    assert media_kind("a.bin", "image") == "image"
    assert media_kind("a.png", "nonsense") == "image"
