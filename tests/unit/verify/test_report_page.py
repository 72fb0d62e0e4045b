"""verify-port's HTML page, rendered from real reports: it leads with the verdict and its
diagnosis, plots each layer's ratio against the line at 1 with the layer's name on hover, lists
the layers closest to their budget first, holds every layer in execution order, escapes every
name, handles rows not judged, NaN and infinite ratios and reports with no rows, and is well formed."""

import html as markup
import json
import math
from dataclasses import replace
from html.parser import HTMLParser

import numpy as np
import pytest

from converter.report import PortReport, render_html, render_text
from converter.verify.report import Report, verdict_line
from helpers.cli import run_verify, spec_path

HOSTILE = "<script>alert('x&y')</script>"  # a module name torch and paddle both accept
VOID = {"meta", "br"}
TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "b", "i", "br", "ul", "li", "pre",
        "section", "svg", "rect", "line", "text", "circle", "span", "table", "tr", "th", "td", "details", "summary",
        "code", "polyline", "polygon"}


class Page(HTMLParser):
    """The page parsed: every element with its attributes, its text and its ancestors, in document
    order; `errors` lists every end tag that closes no open element, and every element left open."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements, self.stack, self.errors, self.doctype = [], [], [], None
        self.feed(text)
        self.close()
        self.errors += [f"<{e['tag']}> never closed" for e in self.stack]

    def handle_decl(self, decl):
        self.doctype = decl

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": "", "parents": list(self.stack)}
        self.elements.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag, attrs):
        self.elements.append({"tag": tag, "attrs": dict(attrs), "text": "", "parents": list(self.stack)})

    def handle_endtag(self, tag):
        if self.stack and self.stack[-1]["tag"] == tag:
            self.stack.pop()
        else:
            self.errors.append(f"</{tag}> closes {self.stack[-1]['tag'] if self.stack else 'nothing'}")

    def handle_data(self, data):
        for element in self.stack:
            element["text"] += data

    def all(self, tag, **attrs) -> list:
        return [e for e in self.elements if e["tag"] == tag and all(e["attrs"].get(k) == v for k, v in attrs.items())]

    def position(self, element) -> int:
        return next(i for i, e in enumerate(self.elements) if e is element)

    def table_after(self, heading: str) -> list:
        """The rows (each a list of its cells' texts, with the row's class) of the first table after `heading`."""
        start = next(self.position(e) for e in self.elements if e["tag"] in ("h3", "summary") and e["text"] == heading)
        table = next(e for e in self.elements[start:] if e["tag"] == "table")
        rows = [e for e in self.elements if e["tag"] == "tr" and e["parents"][-1] is table]
        cells = lambda row: [e["text"] for e in self.elements if e["tag"] == "td" and e["parents"][-1] is row]
        return [(row["attrs"].get("class", ""), cells(row)) for row in rows[1:]]


def parse(text: str) -> Page:
    page = Page(text)
    assert page.doctype == "doctype html" and not page.errors, page.errors
    used = {e["tag"] for e in page.elements}
    assert used <= TAGS, used - TAGS  # no script, no link, no image, no frame: the page opens offline
    assert not [e for e in page.elements if {"src", "href"} & set(e["attrs"]) or any(a.startswith("on") for a in e["attrs"])]
    return page


def _name(r) -> str:
    name = r.torch or "<model>"
    return name if r.paddle == r.torch else f"{name} ~ paddle {r.paddle or '<model>'}"


def _hostile_pair():
    """Linear, Linear under a hostile name, GELU, Linear; paddle's GELU is the tanh form."""
    import paddle
    import torch
    from converter.spec import spec_from_functions

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(16, 32)
            self.blocks = torch.nn.ModuleDict({HOSTILE: torch.nn.Linear(32, 32)})
            self.act = torch.nn.GELU()
            self.out = torch.nn.Linear(32, 8)

        def forward(self, x):
            return self.out(self.act(self.blocks[HOSTILE](self.inp(x))))

    class PaddleNet(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.inp = paddle.nn.Linear(16, 32)
            self.blocks = paddle.nn.LayerDict({HOSTILE: paddle.nn.Linear(32, 32)})
            self.act = paddle.nn.GELU(approximate=True)
            self.out = paddle.nn.Linear(32, 8)

        def forward(self, x):
            return self.out(self.act(self.blocks[HOSTILE](self.inp(x))))

    def torch_model():
        torch.manual_seed(0)
        return TorchNet()

    return spec_from_functions(torch_model, PaddleNet,
                               lambda: (np.random.default_rng(0).standard_normal((4, 16)).astype("float32"),))


@pytest.fixture(scope="module")
def report() -> Report:
    from converter.compare.session import Options
    from converter.verify.run import verify
    found = verify(_hostile_pair(), Options(device="cpu"), bisect=True)
    assert found.first_bad is not None and found.first_bad.torch == "act" and found.diagnosis
    return found


def _plot(page: Page):
    """The points (ratio text of their title, cx, cy, fill, class) and the y of the line at 1."""
    budget = next(e for e in page.all("line") if e["text"] == "ratio 1: the budget")
    points = [(e["text"], float(e["attrs"]["cx"]), float(e["attrs"]["cy"]), e["attrs"]["fill"], e["attrs"]["class"])
              for e in page.all("circle") if "class" in e["attrs"]]
    return points, float(budget["attrs"]["y1"])


def test_a_page_leads_with_the_verdict_and_its_diagnosis(report):
    text, page = render_text(PortReport(report)), parse(render_html(PortReport(report)))
    body = page.all("body")[0]
    first, second = [e for e in page.elements if e["parents"] and e["parents"][-1] is body][:2]
    assert first["tag"] == "h1" and first["text"] == "verify-port: FAIL"
    assert second["tag"] == "section" and second["attrs"]["id"] == "verdict"
    # the verdict line the text report prints, with each cause and hint under it, lead the page
    assert verdict_line(report) in text.splitlines()
    assert verdict_line(report) in second["text"]
    for d in report.diagnosis:
        assert f"cause: {d.cause}" in text and d.cause in second["text"] and d.hint in second["text"]
    lead_ends = max(i for i, e in enumerate(page.elements) if second in e["parents"] or e is second)
    assert lead_ends < page.position(page.all("svg")[0]) < page.position(page.all("table")[0])


def test_the_plot_names_each_layer_on_hover_on_a_log_scale_against_the_line_at_1(report):
    page = parse(render_html(PortReport(report)))
    points, one = _plot(page)
    judged = [r for r in report.layers if r.ratio is not None]
    assert [title.split(": ratio")[0] for title, *_ in points] == [f"{_name(r)} ({r.type})" for r in judged]
    assert HOSTILE in points[1][0]  # the name as the model spells it, on hover
    assert [cx for _, cx, *_ in points] == sorted(cx for _, cx, *_ in points)  # execution order, left to right
    for (title, _, cy, _, band), r in zip(points, judged):
        assert (cy < one) == (r.ratio > 1) and (band == "over") == (r.ratio > 1), title
    # log scale: the height above the line at 1 is the same multiple of log10(ratio) for every point
    scales = [(one - cy) / math.log10(r.ratio) for (_, _, cy, *_), r in zip(points, judged)
              if abs(math.log10(r.ratio)) > 0.3]
    assert len(scales) >= 3 and max(scales) / min(scales) < 1.03, scales


def test_the_closest_layers_come_first_and_a_layer_near_its_budget_is_marked_close(report):
    near = next(i for i, r in enumerate(report.layers) if r.ratio is not None and r.ratio < 0.5)
    layers = list(report.layers)
    layers[near] = replace(layers[near], local_max_abs=0.98 * layers[near].budget, ratio=0.98)
    changed = replace(report, layers=layers)
    page = parse(render_html(PortReport(changed)))
    closest = page.table_after("Closest to their budget")
    ratios = [float(cells[7]) for _, cells in closest]
    judged = sorted((r.ratio for r in layers if r.ratio is not None), reverse=True)
    assert ratios == pytest.approx(judged[:len(ratios)], rel=5e-3) and len(ratios) == len(judged)
    assert closest[0][1][1] == _name(report.first_bad) and closest[0][0] == "over first"
    band, cells = closest[1]  # next after the layer over budget: the clean one at 0.98 of its budget
    assert cells[1] == _name(layers[near]) and band == "close" and cells[8].startswith("close")
    points, one = _plot(page)
    (title, _, cy, fill, band), = [p for p in points if p[0].startswith(_name(layers[near]) + " (")]
    assert band == "close" and "close" in title and fill != "none" and cy > one


def test_every_layer_is_in_the_folded_table_in_execution_order_and_every_name_is_escaped(report):
    text = render_html(PortReport(report))
    assert "<script" not in text.lower() and markup.escape(HOSTILE) in text
    page = parse(text)
    (details,) = page.all("details")
    rows = page.table_after(f"All {len(report.layers)} layers in execution order")
    assert [cells[1] for _, cells in rows] == [_name(r) for r in report.layers]
    assert [int(cells[0]) for _, cells in rows] == list(range(1, len(report.layers) + 1))
    full = next(e for e in page.all("table") if details in e["parents"])
    assert HOSTILE in full["text"]


def test_rows_not_judged_nan_and_infinite_ratios_and_a_ratio_of_zero(report):
    layers = list(report.layers)
    unjudged, nan, inf, zero = (i for i, r in enumerate(layers) if r is not report.first_bad)
    layers[unjudged] = replace(layers[unjudged], budget=None, ratio=None)
    layers[nan] = replace(layers[nan], ratio=float("nan"), note="<b>a NaN</b> & more")
    layers[inf] = replace(layers[inf], budget=0.0, ratio=float("inf"))
    layers[zero] = replace(layers[zero], local_max_abs=0.0, ratio=0.0)
    text = render_html(PortReport(replace(report, layers=layers)))
    page = parse(text)
    closest = page.table_after("Closest to their budget")
    assert [cells[1] for _, cells in closest[:2]] == [_name(layers[nan]), _name(layers[inf])]
    assert [cells[7] for _, cells in closest[:2]] == ["nan", "inf"]
    assert closest[0][1][9] == "<b>a NaN</b> & more" and "&lt;b&gt;a NaN&lt;/b&gt; &amp; more" in text
    assert _name(layers[unjudged]) not in [cells[1] for _, cells in closest]
    rows = page.table_after(f"All {len(layers)} layers in execution order")
    assert rows[unjudged][0] == "unjudged" and rows[unjudged][1][7] == "-" and rows[unjudged][1][8] == "not judged"
    points, one = _plot(page)
    by_name = {title.split(" (")[0]: (cy, fill) for title, _, cy, fill, _ in points}
    assert _name(layers[unjudged]) not in by_name and len(points) == len(layers) - 1
    assert by_name[_name(layers[nan])][0] < one and by_name[_name(layers[inf])][0] < one
    assert any(e["text"] == "NaN, inf" for e in page.all("text"))
    # a ratio of 0 has no place on a log scale: hollow, in the strip under it, below every other point
    cy, fill = by_name[_name(layers[zero])]
    assert fill == "none" and cy >= max(c for c, _ in by_name.values()) and any(e["text"] == "0" for e in page.all("text"))


def test_a_report_with_no_rows(report):
    empty = Report([], None, report.precision, [], "full", 1)
    page = parse(render_html(PortReport(empty)))
    assert page.all("h1")[0]["text"] == "verify-port: PASS" and not page.all("circle")
    assert page.table_after("All 0 layers in execution order") == []
    assert page.all("section", id="verdict")[0]["text"] == verdict_line(empty)


@pytest.mark.slow
def test_the_command_line_page_holds_every_layer_of_its_json_and_leads_with_its_last_line(tmp):
    out, written = tmp / "r.json", tmp / "r.html"
    r = run_verify("--spec", spec_path("cnn"), "--device", "cpu", "--json", out, "--html", written)
    assert r.code == 0, r
    body, page = json.loads(out.read_text()), parse(written.read_text())
    assert r.stdout.strip().splitlines()[-1] == page.all("section", id="verdict")[0]["text"]
    rows = page.table_after(f"All {len(body['layers'])} layers in execution order")
    assert [cells[1] for _, cells in rows] == [_name(r) for r in Report.from_json(body).layers]
    assert len(rows) == len(body["layers"]) > 0
    points, one = _plot(page)
    assert len(points) == sum(layer["ratio"] is not None for layer in body["layers"])
    assert all(cy > one for _, _, cy, *_ in points)  # a clean port: every point under the line at 1


@pytest.mark.slow
def test_a_failed_training_check_leads_the_composed_page_with_its_diagnosis():
    import paddle

    from converter import PortSpec, VerifyOptions, verify_port
    module = PortSpec.from_file(spec_path("train_mlp")).module
    summed = verify_port(PortSpec(module.torch_model, module.paddle_model, module.inputs, batches=module.batches(),
                                  torch_loss=module.torch_loss, torch_optimizer=module.torch_optimizer,
                                  paddle_loss=lambda o, t: paddle.nn.functional.cross_entropy(o, t, reduction="sum")),
                         VerifyOptions(device="cpu", train=True, steps=2))
    assert summed.train.verdict == "fail" and summed.forward.verdict == "pass" and summed.train.diagnosis
    from converter.report import verdict_line as composed_line
    page = parse(render_html(summed))
    (lead,) = page.all("section", id="verdict")
    assert composed_line(summed) in lead["text"] and composed_line(summed) == render_text(summed).splitlines()[-1]
    assert all(d.cause in lead["text"] for d in summed.train.diagnosis)
    training = next(e for e in page.all("h2") if e["text"].startswith("Training checks"))
    assert page.position(lead) < page.position(training) < page.position(page.all("section", id="forward")[0])
