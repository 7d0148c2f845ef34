"""Text from outside put into a report's Markdown: a question, a source's title, body or address, an
upstream's error, a model's sentence. Such text is shown as it reads, never obeyed: it cannot end a
line or a link, and cannot open an image, a link, an autolink, raw HTML or a code span, so the only
links in a report are the citations and references the writer makes, and no export or viewer is
made to fetch anything a source or a question names."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

# what CommonMark lets open or end a link, an image, an autolink, raw HTML or a code span, and the
# backslash that escapes them; emphasis (* and _) is left alone, it can swallow nothing
_OPENERS = re.compile(r"([\\`\[\]<>])")
_ESCAPED = re.compile(r"\\([\\`\[\]<>])")

# kept as they are in a link target: what a URL is made of ([ ] of an IPv6 host included, which
# CommonMark allows there), % so an address percent-encoded already is not encoded twice; everything
# else (spaces, line breaks, controls, ( ) < > " ` \ and every non-ASCII character) is percent-encoded,
# so nothing a source puts in its address can end the link
_URL_SAFE = "!#$%&'*+,-./:;=?@_~[]"
# an & that would read as an entity (&#91; is "[" to a Markdown reader) is backslash-escaped instead:
# percent-encoding it would change what a query string says
_ENTITY_AMPERSAND = re.compile(r"&(?=#?[A-Za-z0-9]+;)")


def inline_text(text: object) -> str:
    """`text` as one line of inert Markdown: whitespace (line breaks included) collapsed to single
    spaces, and every character that could open or end a construct backslash-escaped."""
    return _OPENERS.sub(r"\\\1", " ".join(str(text).split()))


def read_text(markdown: str) -> str:
    """What `inline_text` escaped, as it read (for a saved report read back as sources)."""
    return _ESCAPED.sub(r"\1", markdown)


LIBRARY_LINK = "#library/"  # where the page opens a passage of the user's library (page.js)


def link_target(url: str) -> str:
    """A URL as a Markdown link target: one token that no reader ends early. A DOI such as
    10.1016/0306-4573(88)90021-0 keeps its parentheses as %28 %29, a line break in an address becomes
    %0A instead of a new paragraph."""
    return _ENTITY_AMPERSAND.sub(r"\\&", quote(url.strip(), safe=_URL_SAFE))


def read_link(target: str) -> str:
    """The URL a `link_target` names."""
    return unquote(target.replace("\\&", "&"))
