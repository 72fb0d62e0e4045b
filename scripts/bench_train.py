"""Benchmark verify-port --train against plain training, measured in the same run.

The baseline is N plain training steps on both sides (forward, loss, backward, optimizer step and
scheduler step, on torch's model and on paddle's, with the spec's batches, losses and optimizers);
--train's cost is the training checks alone (the forward check of verify-port is not counted).
Printed as a ratio (target <= 4). Each figure is the best of --repeat rounds, each round running the
three in turn (these machines are noisy).

    python scripts/bench_train.py [--spec FILE | --width W] [--steps N] [--repeat R] [--threads T]

The default spec is tests/specs/train_bench.py: a 4-block residual MLP of width 256 (--width W: of
width W), batches of 64. --threads T sets torch's CPU thread count for everything measured (paddle
computes on one core on CPU either way): --threads 1 measures the work alone, where torch's threads
would wait for cores that other work on the machine holds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_SPEC = os.path.join(ROOT, "tests", "specs", "train_bench.py")
WIDTH = "TRAIN_BENCH_WIDTH"  # the default spec's hidden width, read when it is loaded


def plain_steps(spec, steps: int) -> float:
    """Seconds for N plain training steps on each side."""
    import torch

    from converter.train.loop import call_model, paddle_loss, to_paddle, to_torch, torch_loss
    from converter.train.optimizer import translate
    from converter.train.spec import TrainSpec
    tspec = TrainSpec(spec)
    batches = tspec.batches(steps)
    tmodel, pmodel = spec.torch_model(), spec.paddle_model()
    tmodel.train()
    pmodel.train()
    topt, tsched = tspec.torch_optimizer(tmodel)
    given = tspec.paddle_optimizer(pmodel)
    popt, psched = given if given is not None else translate(
        *tspec.torch_optimizer(tmodel), tspec.clip_grad_norm).build(pmodel)
    start = time.perf_counter()
    for inputs, target in batches:
        topt.zero_grad()
        loss = torch_loss(tspec, call_model(tmodel, to_torch(inputs, torch.float32, "cpu")),
                          to_torch(target, torch.float32, "cpu"))
        loss.backward()
        if tspec.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(tmodel.parameters(), tspec.clip_grad_norm)
        topt.step()
        if tsched is not None:
            tsched.step()
        ploss = paddle_loss(tspec, call_model(pmodel, to_paddle(inputs)), to_paddle(target))
        ploss.backward()
        popt.step()
        popt.clear_grad()
        if psched is not None:
            psched.step()
    return time.perf_counter() - start


def verify_seconds(spec, steps: int, train: bool) -> float:
    """Seconds for verify-port on `spec`: the forward check, and with `train` the training checks too."""
    from converter.api import VerifyOptions, verify_port
    start = time.perf_counter()
    report = verify_port(spec, VerifyOptions(device="cpu", train=train, steps=steps))
    elapsed = time.perf_counter() - start
    if train and report.train.verdict != "pass":
        raise SystemExit(f"the benchmark pair does not pass --train: {report.train.first_bad}")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=DEFAULT_SPEC)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--width", type=int, help="the default spec's hidden width (256)")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own count)")
    args = parser.parse_args()
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.width is not None:
        if os.path.abspath(args.spec) != DEFAULT_SPEC:
            parser.error("--width sets the default spec's width; give --spec or --width, not both")
        os.environ[WIDTH] = str(args.width)
    warnings.simplefilter("ignore")
    from converter.lazy import import_paddle
    import_paddle()
    if args.threads is not None:
        import torch
        torch.set_num_threads(args.threads)
    from converter.spec import PortSpec
    # the plain steps and verify-port with --train and without, in turn in every round, so that drift
    # on a noisy machine hits all three alike: the training checks' cost is the difference of the best
    # of the two verify-port runs, against the best of the plain steps
    plain, both, forward = [], [], []
    for _ in range(args.repeat):
        plain.append(plain_steps(PortSpec.from_file(args.spec), args.steps))
        both.append(verify_seconds(PortSpec.from_file(args.spec), args.steps, True))
        forward.append(verify_seconds(PortSpec.from_file(args.spec), args.steps, False))
    plain = min(plain)
    checked = min(both) - min(forward)
    ratio = checked / plain
    width = f", width {args.width}" if args.width is not None else ""
    threads = f", {args.threads} torch thread(s)" if args.threads is not None else ""
    print(f"spec {os.path.relpath(args.spec, ROOT)}{width}, {args.steps} steps{threads}")
    print(f"plain training, both sides: {plain:.3f} s")
    print(f"verify-port: {min(both):.3f} s with --train, {min(forward):.3f} s without (the forward check)")
    print(f"verify-port --train checks: {checked:.3f} s")
    print(f"ratio: {ratio:.2f} x (target <= 4): {'OK' if ratio <= 4 else 'OVER'}")


if __name__ == "__main__":
    main()
