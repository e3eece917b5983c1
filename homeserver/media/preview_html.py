"""The Open Graph object of an HTML page, for link previews (media/preview.py).

Parsed with the standard library's `html.parser.HTMLParser`, which takes any HTML, broken or
cut short, never with patterns over the text. As Synapse does: the page's Open Graph
`<meta property="og:...">` first; what they lack from the `<title>` (og:title), the
`<meta name="description">` (og:description) and the first `<img src>` (og:image). The
image's URL is made absolute against the page's; fetching it is the previewer's.
"""

from __future__ import annotations

import codecs
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

# A page names at most this many og: keys, each value at most this long: a hostile page
# cannot make the answer (and the stored row) large.
MAX_OG_KEYS = 30
MAX_KEY_CHARS = 50
MAX_VALUE_CHARS = 1000
# Where a <meta charset> must be, as HTML says: in the first 1024 bytes.
CHARSET_SNIFF_BYTES = 1024


class _CharsetParser(HTMLParser):
    """The charset a page's head declares: `<meta charset>`, or http-equiv Content-Type."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.charset: str | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag != "meta" or self.charset is not None:
            return
        values = {k: v or "" for k, v in attrs}
        if values.get("charset"):
            self.charset = values["charset"].strip()
        elif values.get("http-equiv", "").lower() == "content-type":
            _, _, params = values.get("content", "").partition("charset=")
            self.charset = params.split(";")[0].strip() or None


class _OpenGraphParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.og: dict[str, str] = {}
        self.description: str | None = None
        self.title: str | None = None
        self.first_image: str | None = None
        self._title_parts: list[str] | None = None
        self._svg_depth = 0  # an <svg>'s <title> names a drawing, not the page

    def handle_starttag(self, tag: str, attrs: list) -> None:
        values = {k: v for k, v in attrs if v is not None}
        if tag == "svg":
            self._svg_depth += 1
        elif tag == "meta":
            self._meta(values)
        elif tag == "title" and self.title is None and not self._svg_depth:
            self._title_parts = []
        elif tag == "img" and self.first_image is None and values.get("src", "").strip():
            self.first_image = values["src"].strip()

    def _meta(self, values: dict) -> None:
        key = (values.get("property") or values.get("name") or "").strip()
        content = values.get("content")
        if not key or content is None:
            return
        if len(key) > MAX_KEY_CHARS:
            return
        if key.lower().startswith("og:") and len(self.og) < MAX_OG_KEYS:
            self.og.setdefault(key.lower(), content.strip()[:MAX_VALUE_CHARS])
        elif key.lower() == "description" and self.description is None:
            self.description = content.strip()[:MAX_VALUE_CHARS]

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg" and self._svg_depth:
            self._svg_depth -= 1
        elif tag == "title" and self._title_parts is not None:
            self.title = " ".join("".join(self._title_parts).split())[:MAX_VALUE_CHARS]
            self._title_parts = None

    def handle_data(self, data: str) -> None:
        if self._title_parts is not None:
            self._title_parts.append(data)


def _charset(body: bytes, declared: str | None) -> str:
    """The header's charset, else the page's own, else UTF-8; only one Python knows."""
    sniffer = _CharsetParser()
    sniffer.feed(body[:CHARSET_SNIFF_BYTES].decode("latin-1"))
    for name in (declared, sniffer.charset):
        if name:
            try:
                return codecs.lookup(name).name
            except LookupError:
                continue
    return "utf-8"


def _absolute_image(page_url: str, src: str) -> str | None:
    url = urljoin(page_url, src)
    return url if urlsplit(url).scheme in ("http", "https") else None


def open_graph(body: bytes, charset: str | None, page_url: str) -> dict:
    """The page's Open Graph object, og:image an absolute http(s) URL (or absent)."""
    parser = _OpenGraphParser()
    parser.feed(body.decode(_charset(body, charset), errors="replace"))
    parser.close()  # a page cut short ends here, with what was read
    og: dict = dict(parser.og)
    if not og.get("og:title") and parser.title:
        og["og:title"] = parser.title
    if not og.get("og:description") and parser.description:
        og["og:description"] = parser.description
    image = og.get("og:image") or parser.first_image
    og.pop("og:image", None)
    if image:
        absolute = _absolute_image(page_url, image)
        if absolute is not None:
            og["og:image"] = absolute
    return og
