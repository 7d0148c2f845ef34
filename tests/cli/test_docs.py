"""The documentation's generated page and its links: docs/configuration.md is what
docs/gen_configuration.py makes from the code now, and every relative link of the README resolves."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_configuration", ROOT / "docs" / "gen_configuration.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_what_the_generator_makes_now() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == generator().render(), "docs/configuration.md is out of date: run `make docs` and commit it"


def test_the_configuration_reference_names_every_setting_once() -> None:
    from fedresearch.core.settings import Settings
    from fedresearch.retrievers import ADAPTERS

    classes = [Settings, *(upstream.about.settings for upstream in ADAPTERS)]
    names = [str(field.validation_alias) for settings in classes for field in settings.model_fields.values()]
    text = generator().render()
    for name in names:
        assert text.count(f"| `{name}`") + text.count(f"<br>`{name}`") == 1, name


def test_every_relative_link_of_the_readme_resolves() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    relative = [t for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert relative, "the README links no file"
    for target in relative:
        assert (ROOT / target.split("#")[0]).exists(), target
