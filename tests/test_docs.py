"""The documentation keeps up with the settings: a newcomer finds every knob in the README's
EngineConfig list and its trade-off in docs/design.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from code2wav.engine.build import EngineConfig
from code2wav.model.choices import LayerChoices
from code2wav.stream.schedule import SchedulePolicy

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = [(EngineConfig, ""), (SchedulePolicy, "schedule."), (LayerChoices, "layers.")]


def _readme_settings() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("### EngineConfig")
    return text[start : text.index("\n## ", start)]


@pytest.mark.parametrize(("config", "prefix"), SECTIONS, ids=[c.__name__ for c, _ in SECTIONS])
def test_every_setting_is_listed_in_the_readme_and_explained_in_the_design(config, prefix):
    """Each field of the config, its schedule and its layer choices is named (in backticks) in
    the README's EngineConfig list and, with its dotted path, in docs/design.md."""
    readme, design = _readme_settings(), (ROOT / "docs" / "design.md").read_text()
    fields = [f.name for f in dataclasses.fields(config)]
    assert fields
    assert [f for f in fields if f"`{f}`" not in readme] == []
    assert [f for f in fields if f"`{prefix}{f}`" not in design] == []
