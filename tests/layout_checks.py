"""What every command's table must give a reader at 80 columns (a tmux pane): each name
whole, and beside its figures."""

from __future__ import annotations

import re


def names_beside_figures(lines, names):
    """Each name whole on one line, and on the line of its figures (a table row), or heading
    a card whose figure lines follow it: never in a table of names apart from its figures."""
    for name in names:
        at = [i for i, line in enumerate(lines) if re.search(rf"(?<![\w+-]){re.escape(name)}(?![\w+-])", line)]
        assert at, f"{name!r} is split across lines or missing"
        i = at[0]
        if lines[i].startswith("#"):  # a card: its status after the name, or its figures indented right below
            assert re.match(r": \S", lines[i].split(name, 1)[1]) or re.match(r"    \S.*: \S", lines[i + 1]), \
                lines[i:i + 2]
        else:
            assert re.search(r"\d", lines[i].split(name, 1)[1]), f"{name!r}'s row has no figures: {lines[i]!r}"
