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


def in_terminal(command, args, width=80):
    """What `command` prints to a terminal `width` columns wide (rich takes TTY_COMPATIBLE=1 for
    one; piped, they are laid out for $COLUMNS, else 80), its styles removed."""
    from click.testing import CliRunner

    result = CliRunner().invoke(command, list(args), env={"TTY_COMPATIBLE": "1", "COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return re.sub(r"\x1b\[[0-9;]*m", "", result.output)


def chart_problems(fig):
    """What a reader of the chart would trip on, measured with matplotlib's renderer as the PNG
    is laid out: tick labels of an axis overlapping, a title or a point's label outside the
    figure or running into another, a point's label outside its axes, a legend over a plot."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()

    def box(artist):
        return artist.get_window_extent(renderer).padded(-0.5)  # touching is not overlapping

    def inside(inner, outer):
        return outer.x0 - 1 <= inner.x0 and inner.x1 <= outer.x1 + 1 and outer.y0 - 1 <= inner.y0 and \
            inner.y1 <= outer.y1 + 1

    def clashes(named):
        return [f"{a!r} overlaps {b!r}" for i, (a, box_a) in enumerate(named) for b, box_b in named[i + 1:]
                if box_a.overlaps(box_b)]

    problems = []
    titles = [(t.get_text(), box(t)) for t in [fig._suptitle, *(ax.title for ax in fig.axes)] if t and t.get_text()]
    problems += [f"title {text!r} leaves the figure" for text, b in titles if not inside(b, fig.bbox)]
    problems += clashes(titles)
    for ax in fig.axes:
        for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
            problems += clashes([(t.get_text(), box(t)) for t in ticks if t.get_visible() and t.get_text()])
        labels = [(t.get_text(), box(t)) for t in ax.texts if t.get_text()]
        problems += [f"label {text!r} leaves its axes" for text, b in labels if not inside(b, ax.bbox)]
        problems += clashes(labels)
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        if legend is not None:
            problems += [f"a legend covers the plot of {ax.get_title()!r}" for ax in fig.axes
                         if ax.get_label() != "<colorbar>" and box(legend).overlaps(ax.bbox)]
    return problems
