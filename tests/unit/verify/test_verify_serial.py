"""The speed machinery (torch work on a worker thread beside the paddle passes, analysis
threads) changes how long a run takes, never what it reports: a serial run gives the same
report on the bundled example."""

import pytest
import json

from converter.examples import bert_port


def _report(serial: bool):
    from converter.spec import load_spec
    from converter.verify.report import render_text
    from converter.verify.run import verify
    from converter.compare.session import Options
    report = verify(load_spec(bert_port.__file__), Options(device="cpu", serial=serial), bisect=True)
    return render_text(report, max_rows=1000), _rounded(report.to_json())


def _rounded(value):
    """Floats to 6 significant digits: the two runs may sum float64 references with other thread
    counts, which moves the 16th digit."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


@pytest.mark.slow


def test_serial_and_overlapped_runs_give_the_same_report():
    text_serial, body_serial = _report(serial=True)
    text_overlapped, body_overlapped = _report(serial=False)
    assert body_serial["verdict"] == "fail" and body_serial["first_bad_layer"]["torch"].endswith("intermediate_act_fn")
    assert text_serial == text_overlapped
    assert json.dumps(body_serial, sort_keys=True) == json.dumps(body_overlapped, sort_keys=True)


def test_the_environment_variable_asks_for_serial(monkeypatch):
    from converter.compare.session import Options
    monkeypatch.setenv("T2P_SERIAL", "1")
    assert Options().serial
    monkeypatch.delenv("T2P_SERIAL")
    assert not Options().serial
