"""The README and docs/ stay whole: every image they show is a PNG that scripts/screenshots.py wrote, of a size a
reader's page can load, every link between them reaches a file and a heading that exist, and the README opens
with the dashboard."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A screenshot of a 1400 px wide window, palette-quantized: tens to a few hundred KiB. Beyond these bounds it is
# a blank capture or one that skipped the quantizing.
MIN_IMAGE_BYTES, MAX_IMAGE_BYTES = 10_000, 600_000
MAX_IMAGE_SIDE_PX = 2_000
README_OPENING_LINES = 40


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _targets(pattern: re.Pattern, page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code is not a link
    return [target for target in pattern.findall(text) if not re.match(r"[a-z]+:", target)]


def _anchors(page: Path) -> set[str]:
    """GitHub's ids for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


IMAGES = sorted({(page, target) for page in PAGES for target in _targets(IMAGE, page)})
LINKS = sorted({(page, target) for page in PAGES for target in _targets(LINK, page)})


def test_the_readme_shows_the_dashboard_in_its_opening_lines():
    opening = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:README_OPENING_LINES])
    shown = IMAGE.findall(opening)
    assert len(shown) >= 2, shown  # a live run and a comparison
    assert all(target.startswith("docs/images/") for target in shown), shown


@pytest.mark.parametrize("page, target", IMAGES, ids=lambda part: _page_id(part) if isinstance(part, Path) else part)
def test_every_image_shown_is_a_png_of_sane_size(page, target):
    path = (page.parent / target).resolve()
    assert path.is_file(), f"{_page_id(page)} shows {target}, which does not exist: run scripts/screenshots.py"
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), target
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk, first after the signature
    assert MIN_IMAGE_BYTES <= len(data) <= MAX_IMAGE_BYTES, (target, len(data))
    assert 0 < width <= MAX_IMAGE_SIDE_PX and 0 < height <= MAX_IMAGE_SIDE_PX, (target, width, height)


@pytest.mark.parametrize("page, target", LINKS, ids=lambda part: _page_id(part) if isinstance(part, Path) else part)
def test_every_link_between_the_docs_reaches_a_file_and_heading(page, target):
    file_part, _, anchor = target.partition("#")
    linked = (page.parent / file_part).resolve() if file_part else page
    assert linked.exists(), f"{_page_id(page)} links {target}, which does not exist"
    if anchor:
        assert anchor in _anchors(linked), f"{_page_id(page)} links {target}: no such heading"


def test_every_doc_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in _targets(LINK, ROOT / "README.md")}
    unlinked = [_page_id(page) for page in PAGES[2:] if page.resolve() not in linked]
    assert not unlinked
