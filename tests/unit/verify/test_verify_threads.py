"""verify-port run from threads other than the main one: one after another (each on a fresh thread,
paddle first imported on one of them), and two at once, each giving the rows it gives alone (one of
them emulating TF32 on paddle's side, the other in fp32)."""

import os
import subprocess
import sys
import textwrap
import threading

from converter import VerifyOptions, verify_port
from converter.spec import load_spec

SPECS = os.path.join(os.path.dirname(__file__), "..", "..", "specs")
# one run emulates TF32 on paddle's side: paddle's operators, replaced while it runs, round for its thread alone
RUNS = [("transformer_encoder.py", "full", {}), ("cnn_pool.py", "binary", {"paddle": "tf32"})]


def _rows(name: str, strategy: str, emulate: dict):
    report = verify_port(load_spec(os.path.join(SPECS, name)), VerifyOptions(device="cpu", strategy=strategy,
                                                                                bisect=True, emulate=emulate))
    return str(report.verdict), [(r.torch, r.paddle, r.ratio, r.local_max_abs, r.budget) for r in report.forward.layers]


def test_two_verifications_at_once_give_the_rows_each_gives_alone(monkeypatch):
    # one thread for each verification's torch work: torch's intra-op thread count is the process's,
    # and a count set by one run's worker changes the other's sums in their last bits
    monkeypatch.setenv("T2P_SERIAL", "1")
    alone = [_rows(*run) for run in RUNS]
    together, failed = [None] * len(RUNS), []

    def run(k):
        try:
            together[k] = _rows(*RUNS[k])
        except BaseException as e:  # noqa: BLE001 - said by the assertion below
            failed.append(repr(e))
    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(RUNS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    assert together == alone


def test_verifications_on_fresh_threads_where_paddle_was_first_imported_on_one():
    """paddle keeps its graph mode per thread; imported first on a thread other than the main one,
    it starts every later thread in static-graph mode."""
    script = textwrap.dedent(f"""
        import threading
        from converter import VerifyOptions, verify_port
        from converter.spec import load_spec
        verdicts = []
        def run():
            report = verify_port(load_spec({os.path.join(SPECS, RUNS[0][0])!r}), VerifyOptions(device="cpu"))
            verdicts.append(str(report.verdict))
        for _ in range(2):
            t = threading.Thread(target=run)
            t.start()
            t.join()
        print(verdicts)
    """)
    assert "paddle" not in script.split("from converter")[0]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("['pass', 'pass']"), done.stderr[-2000:]
