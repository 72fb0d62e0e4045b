"""Builders for hostile and malformed checkpoints, written opcode by opcode, and a runner that
bounds a conversion's time and memory. Used by tests/hostile and tests/fuzz."""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---- pickle opcodes (protocol 2, as torch.save writes data.pkl)


def p_str(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def p_int(n: int) -> bytes:
    if -(2 ** 31) <= n < 2 ** 31:
        return b"J" + struct.pack("<i", n)  # BININT
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw  # LONG1


def p_tuple(items) -> bytes:
    return b"(" + b"".join(items) + b"t"  # MARK ... TUPLE


def p_global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def p_ordered_dict() -> bytes:
    return p_global("collections", "OrderedDict") + b")R"


def p_tensor(storage_key="0", numel=4, offset=0, shape=(4,), stride=(1,), storage_type="FloatStorage") -> bytes:
    """The `_rebuild_tensor_v2(storage, offset, shape, stride, False, OrderedDict())` call."""
    pid = p_tuple([p_str("storage"), p_global("torch", storage_type), p_str(storage_key), p_str("cpu"), p_int(numel)])
    args = [pid + b"Q", p_int(offset), p_tuple([p_int(d) for d in shape]), p_tuple([p_int(s) for s in stride]),
            b"\x89", p_ordered_dict()]
    return p_global("torch._utils", "_rebuild_tensor_v2") + p_tuple(args) + b"R"


def p_dict(items) -> bytes:
    """An OrderedDict from (key opcodes, value opcodes) pairs."""
    return p_ordered_dict() + b"(" + b"".join(k + v for k, v in items) + b"u"


def pickle_of(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


def torch_zip(path, data_pkl: bytes, storages: dict, compress=zipfile.ZIP_STORED, prefix="archive",
              byteorder: bytes | None = b"little") -> None:
    """A zip laid out as torch.save writes it: data.pkl, data/<key>, version, byteorder (None: no
    byteorder record, as torch before 1.11 wrote)."""
    with zipfile.ZipFile(path, "w", compression=compress) as z:
        z.writestr(f"{prefix}/data.pkl", data_pkl)
        if byteorder is not None:
            z.writestr(f"{prefix}/byteorder", byteorder)
        for key, raw in storages.items():
            z.writestr(f"{prefix}/data/{key}", raw)
        z.writestr(f"{prefix}/version", b"3\n")


def float_bytes(values, order: str = "<") -> bytes:
    return struct.pack(f"{order}{len(values)}f", *values)


STORAGE_ITEMSIZES = {"FloatStorage": 4, "DoubleStorage": 8, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
                     "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1}


def storage_itemsizes(data_pkl: bytes) -> dict:
    """{storage key: element size} of a torch zip's data.pkl, read with Python's unpickler (every
    global a stand-in: nothing is imported)."""
    import io
    import pickle
    found = {}

    class Reader(pickle.Unpickler):
        def find_class(self, module, name):
            return name if name in STORAGE_ITEMSIZES else (lambda *args: None)

        def persistent_load(self, pid):
            found[pid[2]] = STORAGE_ITEMSIZES[pid[1]]
    Reader(io.BytesIO(data_pkl)).load()
    return found


def big_endian_copy(src, dst, itemsizes: dict | None = None, compress=None) -> None:
    """torch.save's zip `src` rewritten as a big-endian machine writes it: a `byteorder` record of
    `big` and each storage's numbers byteswapped (`itemsizes`: storage key -> its element size, read
    from data.pkl by default); every member keeps its name and order, and its compression unless
    `compress` is given."""
    if itemsizes is None:
        with zipfile.ZipFile(src) as z:
            itemsizes = storage_itemsizes(z.read(next(n for n in z.namelist() if n.endswith("data.pkl"))))
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/byteorder"):
                data = b"big"
            elif "/data/" in info.filename:
                size = itemsizes[info.filename.rsplit("/", 1)[1]]
                data = b"".join(data[i:i + size][::-1] for i in range(0, len(data), size))
            if compress is not None:
                info.compress_type = compress
            zout.writestr(info, data)


# ---- safetensors with a raw header


def safetensors_raw(path, header, data: bytes, pad: bool = True) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


# ---- a conversion in a separate process, with its time and memory bounded

class Bounded:
    def __init__(self, code, stdout, stderr, seconds):
        self.code, self.stdout, self.stderr, self.seconds = code, stdout, stderr, seconds

    def __repr__(self):
        return f"exit {self.code} after {self.seconds:.1f} s\nstdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}"


_RUNNER = ("import sys; sys.path.insert(0, {root!r}); {block}"
           "from converter.cli import convert_weights; convert_weights(sys.argv[1:], prog_name='convert-weights')")


def run_bounded(*args, timeout: float = 60, memory_gb: float | None = None, without_torch: bool = False,
                env: dict | None = None) -> Bounded:
    """convert-weights in a fresh process: killed after `timeout` seconds (the test then fails
    with TimeoutExpired), its address space capped at `memory_gb`, torch unimportable when asked."""
    import time
    block = "sys.modules['torch'] = None; " if without_torch else ""
    code = _RUNNER.format(root=ROOT, block=block)

    def limit():
        if memory_gb is not None:
            cap = int(memory_gb * (1 << 30))
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout, preexec_fn=limit, cwd=ROOT, env=dict(os.environ, **(env or {})))
    return Bounded(p.returncode, p.stdout, p.stderr, time.monotonic() - start)


def assert_one_line_error(r, *words) -> None:
    """Exit 2 with one `error:` line that holds `words`, no traceback, no internal error."""
    assert r.code == 2, r
    text = r.stderr
    assert "Traceback" not in text and "internal error" not in text, r
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, r
    for w in words:
        assert w in text, (w, r)


def no_leftovers(directory) -> list[str]:
    return [f for f in os.listdir(directory) if ".partial" in f]


# ---- a conversion in this process, bounded in time and memory (for the property-based tests)

FUZZ_SCALE = int(os.environ.get("FUZZ_SCALE", "1"))  # e.g. 20: twenty times the examples, freshly random


def fuzz_settings(examples: int):
    """hypothesis settings with a fixed budget: derandomized (the same examples every run) unless
    FUZZ_SCALE asks for a longer, random exploration."""
    from hypothesis import HealthCheck, settings
    return settings(max_examples=examples * FUZZ_SCALE, derandomize=FUZZ_SCALE == 1, deadline=None, database=None,
                    print_blob=True, suppress_health_check=list(HealthCheck))


class Hung(BaseException):
    """Raised by the alarm: a BaseException, so that no `except Exception` in the code under test
    can turn a hang into an ordinary error."""


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def run_in_process(*args, seconds: float = 20, extra_gb: float = 3):
    """convert-weights through click's runner; Hung after `seconds`, MemoryError (exit 2 'out of
    memory', which the caller treats as a failure) past `extra_gb` more address space."""
    import signal
    from click.testing import CliRunner

    from converter.cli import convert_weights

    def alarm(signum, frame):
        raise Hung(f"convert-weights {' '.join(map(str, args))} ran past {seconds} s")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_size() + int(extra_gb * (1 << 30))
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    resource.setrlimit(resource.RLIMIT_AS, (min(cap, hard) if hard != resource.RLIM_INFINITY else cap, hard))
    try:
        r = CliRunner().invoke(convert_weights, [str(a) for a in args], catch_exceptions=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    return Bounded(r.exit_code, r.stdout, r.stderr, 0.0)


def assert_clean_verdict(r) -> None:
    """Exit 0, or exit 2 with exactly one error line; never 1, 3, a traceback or 'out of memory'."""
    assert r.code in (0, 2), r
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr and "out of memory" not in r.stderr, r
    if r.code == 2:
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, r
