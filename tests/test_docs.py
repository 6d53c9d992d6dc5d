"""The README stays a one-screen front door whose links into docs/ resolve (on GitHub, as relative
links, and on the site), and every page in docs/ is in the site's navigation. The same
checks as `mkdocs build --strict` in CI, for a checkout without mkdocs."""
import re

from paths import ROOT

README_MAX_LINES = 150
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs' toc write it: 'verify.json's verdict' -> 'verifyjsons-verdict'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # no headings in code
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(markdown) -> list[str]:
    broken = []
    for target in LINK.findall(markdown.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https: and the like leave the repository
            continue
        path, _, anchor = target.partition("#")
        page = (markdown.parent / path) if path else markdown
        if not page.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(page):
            broken.append(f"{target}: no such heading")
    return broken


def test_the_readme_fits_on_a_screen():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail into docs/"


def test_the_readmes_links_resolve():
    assert broken_links(ROOT / "README.md") == []


def test_the_pages_links_resolve():
    assert [f"{page.name}: {b}" for page in sorted((ROOT / "docs").glob("*.md")) for b in broken_links(page)] == []


def test_every_page_is_in_the_sites_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and [p for p in pages if f": {p}" not in nav] == []


def test_a_broken_link_or_heading_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## verify.json's verdict\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text("[a](docs/page.md#verifyjsons-verdict) [b](docs/gone.md) [c](docs/page.md#nowhere) "
                      "[d](https://example.org/x.md)\n", encoding="utf-8")
    assert broken_links(readme) == ["docs/gone.md: no such file", "docs/page.md#nowhere: no such heading"]
