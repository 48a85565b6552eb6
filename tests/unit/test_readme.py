"""The README tells the truth: its config reference is the generated one, its commands exist."""

from __future__ import annotations

from pathlib import Path

from arctic_platform.rl.config_doc import BEGIN, END, readme_section

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_config_reference_matches_the_models():
    text = README.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == readme_section(), "run `arctic-rl config reference` into README"


def test_readme_metric_list_matches_the_families():
    from arctic_platform.rl.observe import families

    text = README.read_text()
    start = text.index(families.README_BEGIN)
    end = text.index(families.README_END) + len(families.README_END)
    assert text[start:end] == families.readme_section(), "regenerate the README's metric list"


def test_readme_names_the_two_commands_and_ci_runs_the_test_one():
    text = README.read_text()
    assert "./run.sh demo" in text and "./run.sh test" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./run.sh test\n" in ci
