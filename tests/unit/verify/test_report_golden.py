"""Golden files for the text and HTML reports of the bundled example (tests/unit/verify/golden/). Numbers
are masked: the figures are tested elsewhere, against float64; these guard what a report
says and how it is laid out. After an intended change: T2P_UPDATE_GOLDEN=1 pytest tests/unit/verify/test_report_golden.py."""

import os
import re

import pytest

from helpers.cli import ROOT
from converter.examples import bert_port

GOLDEN = os.path.join(ROOT, "tests", "unit", "verify", "golden")
NUMBER = re.compile(r"(?<![\w.])[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?(?![\w.])")
# a figure left out ('-': a layer bit-identical to torch's on the same inputs needs no budget) is
# one as much as a number is: which layers come out exactly equal depends on the CPU's kernels
LEFT_OUT = re.compile(r"(?<=[\s>])-(?=[\s<])")
# the chart's points and gridlines alike: how many layers it plots (a bit-identical one has no local
# error to plot) and how many decades its axis spans depend on the CPU's kernels as well
POINTS = re.compile(r'points="[^"]*"')
GRIDLINES = re.compile(r'(<line [^>]*stroke="#eee"/><text [^>]*>#</text>)+')
MARKS = re.compile(r'(<circle [^>]*class="[^"]*"><title>[^<]*</title></circle>)+')
# which clean layers sit past half of their budget, or close to it, and in what order the closest
# table lists them, depend on the CPU's kernels too: the golden file keeps that table's first row
# (the first bad layer) and the words a band is said in, not which row is in which band
CLOSEST = re.compile(r'(<h3>Closest to their budget</h3>.*?<table><tr>.*?</tr><tr[^>]*>.*?</tr>).*?(</table>)', re.S)
ZERO_LABEL = re.compile(r'<text [^>]*text-anchor="end">#</text>(?=</svg>)')  # drawn where a ratio is 0
BAND = re.compile(r'class="(within|half|close|unjudged)"')
BAND_WORDS = re.compile(r'>(within budget|above # of its budget|close: above # of its budget|not judged)<')


def mask(text: str) -> str:
    """Numbers as #, and the padding and rules that depend on their widths folded."""
    text = LEFT_OUT.sub("#", NUMBER.sub("#", text))
    text = GRIDLINES.sub(r"\1", POINTS.sub('points="#"', text))
    text = MARKS.sub("<circle #><title>#</title></circle>", ZERO_LABEL.sub("", text))
    text = BAND_WORDS.sub(">#<", BAND.sub('class="#"', CLOSEST.sub(r"\1...\2", text)))
    text = re.sub(r"-{3,}", "---", text)
    return "\n".join(re.sub(r"[ \t]+", " ", line).rstrip() for line in text.splitlines()) + "\n"


@pytest.fixture(scope="module")
def report():
    from converter.spec import load_spec
    from converter.verify.run import verify
    from converter.compare.session import Options
    return verify(load_spec(bert_port.__file__), Options(device="cpu"), bisect=True)


@pytest.mark.parametrize("name", ["bert_port.txt", "bert_port.html"])
@pytest.mark.slow
def test_report_matches_its_golden_file(report, name):
    from converter.verify.page import render_html
    from converter.verify.report import render_text
    got = mask(render_text(report, max_rows=1000) if name.endswith(".txt") else render_html(report))
    path = os.path.join(GOLDEN, name)
    if os.environ.get("T2P_UPDATE_GOLDEN") == "1":
        with open(path, "w") as f:
            f.write(got)
    with open(path) as f:
        assert got == f.read()


def test_masking_takes_a_left_out_figure_for_a_number():
    assert mask("norm  LayerNorm  4x256  0  -  0\n<td>-</td>") == mask("norm  LayerNorm  4x256  0  1.2e-07  0\n<td>3</td>")


def test_masking_folds_the_charts_points_and_gridlines():
    one = '<svg><line x1="0" stroke="#eee"/><text x="1">1e-06</text><polyline stroke="#c33" points="1,2 3,4"/></svg>'
    two = ('<svg><line x1="0" stroke="#eee"/><text x="1">1e-06</text><line x1="5" stroke="#eee"/><text x="1">1e-05</text>'
           '<polyline stroke="#c33" points="1,2 3,4 5,6"/></svg>')
    assert mask(one) == mask(two)
    assert mask(one) != mask(one.replace("#c33", "#2a7"))  # which line it draws is kept


def test_masking_keeps_words_and_paths():
    assert mask("encoder.layer.0.output  Linear  2x16x64  1.20e-04  ratio 0.356 (full, 2 paired)\n-----") == \
        "encoder.layer.0.output Linear 2x16x64 # ratio # (full, # paired)\n---\n"


def test_a_cut_table_says_which_rows_it_shows(report):
    from converter.verify.report import render_text
    text = render_text(report, max_rows=5)
    lines = text.splitlines()
    table = lines[2:lines.index(next(line for line in lines if line.startswith("(rows ")))]
    assert len(table) == 5 and any(line.startswith(">> " + report.first_bad.torch) for line in table), table
    assert f"of {len(report.layers)} shown; --rows {len(report.layers)} shows all" in text
    assert "shown;" not in render_text(report, max_rows=1000)
