"""The Open Graph object of HTML pages (media/preview_html.py): og meta first, then the
title, the description and the first image; charsets from the header or the page; broken,
cut and hostile pages."""

from homeserver.media.preview_html import MAX_OG_KEYS, MAX_VALUE_CHARS, open_graph

PAGE_URL = "https://example.org/a/page.html"


def test_open_graph_meta_win_over_the_title_and_description():
    html = b"""<html><head><title>Title</title>
    <meta name="description" content="Meta description">
    <meta property="og:title" content=" OG title ">
    <meta name="og:description" content="OG description">
    <meta property="og:title" content="a second og:title is ignored">
    <meta property="og:site_name" content="Example">
    <meta property="og:image" content="../img/card.png"></head></html>"""
    assert open_graph(html, "utf-8", PAGE_URL) == {
        "og:title": "OG title",
        "og:description": "OG description",
        "og:site_name": "Example",
        "og:image": "https://example.org/img/card.png",
    }


def test_without_og_the_title_description_and_first_image_stand_in():
    html = b"""<html><head><title>The
      page&amp;title</title><meta name="Description" content="About"></head>
    <body><svg><title>an icon</title></svg><img alt="none"><img src="/first.jpg">
    <img src="/second.jpg"></body></html>"""
    assert open_graph(html, None, PAGE_URL) == {
        "og:title": "The page&title",
        "og:description": "About",
        "og:image": "https://example.org/first.jpg",
    }


def test_charsets_come_from_the_header_then_the_page():
    latin = "<title>Café</title>".encode("latin-1")
    assert open_graph(latin, "iso-8859-1", PAGE_URL) == {"og:title": "Café"}
    declared = b'<meta charset="windows-1252">' + "<title>Café</title>".encode("cp1252")
    assert open_graph(declared, None, PAGE_URL) == {"og:title": "Café"}
    unknown = "<title>Café</title>".encode()
    assert open_graph(unknown, "no-such-charset", PAGE_URL) == {"og:title": "Café"}


def test_a_page_cut_short_or_broken_gives_what_was_read():
    assert open_graph(b"<html><head><title>Cut sho", None, PAGE_URL) == {}
    broken = b"<title>Fine</title><meta property=og:description content='no quotes'><<p"
    assert open_graph(broken, None, PAGE_URL) == {
        "og:title": "Fine",
        "og:description": "no quotes",
    }


def test_hostile_pages_give_a_bounded_object_and_no_other_schemes():
    many = b"".join(b'<meta property="og:k%d" content="v">' % i for i in range(500))
    assert len(open_graph(many, None, PAGE_URL)) == MAX_OG_KEYS
    long_key = b'<meta property="og:%s" content="v">' % (b"k" * 60)
    assert open_graph(long_key, None, PAGE_URL) == {}
    long_title = b"<title>" + b"x" * 100_000 + b"</title>"
    assert len(open_graph(long_title, None, PAGE_URL)["og:title"]) == MAX_VALUE_CHARS
    scripted = b'<meta property="og:image" content="javascript:alert(1)">'
    assert open_graph(scripted, None, PAGE_URL) == {}
    data = b'<img src="data:image/png;base64,AAAA">'
    assert open_graph(data, None, PAGE_URL) == {}
