"""Whether this host has the fonts a report needs: Chinese characters render as empty boxes in a
PDF (WeasyPrint draws with the fonts fontconfig finds) unless a font with them is installed. Light
on purpose: a supervisor asks it at start, and imports nothing of the report's renderers."""

from __future__ import annotations

import os
import shutil
import subprocess

# fonts that cover Chinese, by the words in their files' names, where fontconfig's tools are missing
_CJK_FONT_NAMES = ("cjk", "sourcehan", "wqy", "notosanssc", "notoserifsc", "droidsansfallback", "simsun", "msyh")
_FONT_FOLDERS = ("/usr/share/fonts", "/usr/local/share/fonts", "~/.fonts", "~/.local/share/fonts", "/Library/Fonts")


def cjk_font_installed() -> bool:
    """Whether a font with Chinese characters is installed, as fontconfig (WeasyPrint's font
    source) finds them: asked again each time, so that a font installed meanwhile counts."""
    listing = shutil.which("fc-list")
    if listing is not None:
        found = subprocess.run([listing, ":lang=zh", "family"], capture_output=True, text=True, timeout=10, check=False)
        return bool(found.stdout.strip())
    for folder in _FONT_FOLDERS:
        for _, _, names in os.walk(os.path.expanduser(folder)):
            if any(word in name.lower() for name in names for word in _CJK_FONT_NAMES):
                return True
    return False


MISSING_CJK_FONT = (
    "no font with Chinese characters is installed: PDF exports of reports in Chinese show them as empty "
    "boxes until one is (on Debian or Ubuntu: apt-get install fonts-noto-cjk)"
)
