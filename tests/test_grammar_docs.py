"""docs/formats.md states the grammar and the caps an independent implementation builds against:
the page's tables must be the code's (ale.core.grammar.RULES, ale.runner.recorder)."""

from __future__ import annotations

import re
from pathlib import Path

from ale.core import bundle, grammar
from ale.runner.recorder import BUDGETS, CAPS

FORMATS = Path(__file__).resolve().parents[1] / "docs" / "formats.md"
_KEYS = {
    grammar.NO_KEY: "",
    grammar.TASKS_KEY: "`tasks`",
    grammar.TASK_KEY: "`task`",
    grammar.EPISODE_KEY: "`episode`",
    grammar.SESSION_KEY: "`session`",
    grammar.REQUEST_KEY: "`request`",
    grammar.BUDGET_KEY: "`budget`",
}


def _phases(phases: frozenset[int]) -> str:
    ordered = sorted(phases)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"`{grammar.PHASES[ordered[0]]}` to `{grammar.PHASES[ordered[-1]]}`"
    return ", ".join(f"`{grammar.PHASES[p]}`" for p in ordered)


def _table(marker: str) -> list[list[str]]:
    text = FORMATS.read_text(encoding="utf-8")
    block = text[text.index(marker) :].split("\n\n", 1)[0]
    rows = [line for line in block.splitlines()[1:] if line.startswith("|")][2:]  # past the header
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_the_grammar_table_in_formats_md_is_the_code() -> None:
    expected = [
        [
            f"`{rule.producer}`",
            f"`{rule.kind}`",
            _phases(rule.allowed),
            f"`{grammar.PHASES[rule.then]}`" if rule.then is not None else "",
            _KEYS[rule.key],
        ]
        for rule in grammar.RULES
    ]
    assert _table("<!-- grammar:rules -->") == expected


def test_the_phases_and_reasons_in_formats_md_are_the_code() -> None:
    text = FORMATS.read_text(encoding="utf-8")
    section = text[text.index("### The grammar") : text.index("### Caps and budgets")]
    order = re.findall(r"`([a-z_]+)`", section[section.index("**Phases**") : section.index("**Rules.**")])
    assert [p for p in order if p in grammar.PHASES] == list(grammar.PHASES)
    for reason in grammar.REASONS:
        assert f"`{reason}`" in section, reason
    for word in grammar.HIDDEN_REASONING_WORDS:
        assert f"`{word}`" in section, word


def _size(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+) (KiB|MiB)", text).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "KiB" else 1024 * 1024)


def test_the_caps_and_budgets_in_formats_md_are_the_code() -> None:
    text = FORMATS.read_text(encoding="utf-8")
    section = text[text.index("### Caps and budgets") :]
    caps = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\| `(\w+)` \| (\d+ [KM]iB) \| (\d+ [KM]iB) \|", line)
        if match:
            caps[match[1]] = (_size(match[2]), _size(match[3]))
    assert caps == {producer: (c.string_bytes, c.line_bytes) for producer, c in CAPS.items()}
    site = bundle.Limits().max_ciphertext
    assert f"L = {site // (1024 * 1024)} MiB" in section
    budgets = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\| ((?:`[a-z.]+`(?:, )?)+) \| .* \| L/(\d+) = (\d+ [KM]iB)(?: each)? \|", line)
        if match:
            for channel in re.findall(r"`([a-z.]+)`", match[1]):
                assert _size(match[3]) == site // int(match[2])
                budgets[channel] = site // int(match[2])
    assert budgets == dict(BUDGETS)
