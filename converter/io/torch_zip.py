"""torch's zip checkpoints read without torch.

A `torch.save` file is a zip: `<name>/data.pkl` (the structure, a pickle whose tensors
point at storages by persistent id) and `<name>/data/<key>` (each storage's raw bytes).
The pickle is read by `unpickle.load`, which builds data only and knows a handful of names
a state dict uses (the tensor and parameter rebuild functions, the typed storage classes,
OrderedDict), each mapped to a stand-in: nothing is imported and no pickled code runs.

Everything is checked before any tensor memory is touched, after the whole pickle is read:
every tensor's shape, stride and offset (no negative strides or sizes, at most 64
dimensions, the view inside its storage; a view that repeats elements, as an expanded one
does, is read as torch reads it, within MAX_REPEATED bytes for the whole file), every storage
against its zip member (its size; stored members are read and their CRC checked when first
read; deflated ones are inflated, capped at their declared size, CRC checked by zipfile).
The `byteorder` record says how the storages' numbers are stored (`big` on s390x or POWER);
each tensor is read in this machine's order.

A pickle that names anything else (a global this reader has no stand-in for) is handed to
torch.load(weights_only=True) with `NotPlain`, but only after the whole pickle has passed
the same structural checks (dict keys, memo, depth, tensor geometry), so that torch's
unpickler never sees a hash bomb or an out-of-bounds view.
"""

from __future__ import annotations

import math
import os
import struct
import sys
import threading
import zipfile
import zlib

import numpy as np

from .. import dtypes
from ..errors import CheckFailed, UserError, quoted
from . import unpickle
from .copyrange import c_ordered
from .stable import StableFile
from .base import MAX_BYTES, MAX_DIMS, Source, TensorInfo, check_repeats, shape_problem, valid_bools

try:  # ISA-L's CRC-32, about four times zlib's speed: checking every storage costs little
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same numbers
    from zlib import crc32

STORAGE_DTYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
    "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
}
MAX_PICKLE = 32 << 20  # a state dict's data.pkl holds about 100 bytes per tensor
MAX_INFLATED = 4 << 30  # one deflated storage held in memory
DEFLATE_RATIO = 1032  # deflate's largest possible expansion


class NotPlain(Exception):
    """Not a plain zip state dict that this reader handles; torch.load decides."""


def byte_order(archive: zipfile.ZipFile, record: zipfile.ZipInfo | None, path: str) -> str:
    """'<' or '>': how the storages' numbers are stored, as the `byteorder` record says (torch.save
    writes `little` or `big`; a file without the record is little-endian, as torch.load takes it)."""
    if record is None:
        return "<"
    if record.file_size > 64:
        raise _bad(path, f"its byteorder record is {record.file_size} bytes, not 'little' or 'big'")
    text = archive.read(record).strip()
    if text in (b"little", b""):
        return "<"
    if text == b"big":
        return ">"
    raise _bad(path, f"its byteorder record says {quoted(text.decode('latin-1'))[:40]}, not 'little' or 'big'")


def strided(flat: np.ndarray, offset: int, shape, stride, order: str) -> np.ndarray:
    """The view (offset, shape, stride in elements) of a storage array whose numbers are stored in
    byte order `order`, in this machine's order: the view itself, or a copy where the bytes are
    swapped (repeated elements, stride 0 included, are read as torch reads them)."""
    stored = flat.dtype.newbyteorder(order) if flat.dtype.itemsize > 1 else flat.dtype
    strides = tuple(s * flat.dtype.itemsize if d > 1 else 0 for d, s in zip(shape, stride))
    view = np.lib.stride_tricks.as_strided(flat[offset:].view(stored), shape=tuple(shape), strides=strides,
                                           writeable=False)
    return view if stored == flat.dtype else view.astype(flat.dtype)


def _bad(path: str, why: str) -> UserError:
    return UserError(f"{quoted(path)} is not a valid torch checkpoint: {why}; re-save it with torch.save(state_dict) "
                     "or re-download it")


class StorageType:
    def __init__(self, dtype: str):
        self.dtype = dtype


class Storage:
    __slots__ = ("dtype", "key", "numel")

    def __init__(self, dtype: str, key: str, numel: int):
        self.dtype, self.key, self.numel = dtype, key, numel


def _int(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise unpickle.Refused(f"a tensor's {what} is a {type(value).__name__}, not an integer")
    return value


def _ints(values, what: str) -> tuple[int, ...]:
    if not isinstance(values, tuple):
        raise unpickle.Refused(f"a tensor's {what} is a {type(values).__name__}, not a tuple")
    if len(values) > MAX_DIMS:
        raise unpickle.Refused(f"a tensor with {len(values)} dimensions (at most {MAX_DIMS})")
    return tuple(_int(v, what) for v in values)


class TensorRecord:
    """What `_rebuild_tensor_v2` was asked for; immutable (a BUILD on it is refused)."""

    __slots__ = ("storage", "offset", "shape", "stride")

    def __init__(self, storage, offset, shape, stride):
        if not isinstance(storage, Storage):
            raise unpickle.Refused("a tensor without a storage")
        self.storage, self.offset = storage, _int(offset, "offset")
        self.shape, self.stride = _ints(shape, "shape"), _ints(stride, "stride")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # Python integers: exact at any size


def view_problem(shape, stride, offset: int, storage_numel: int, itemsize: int) -> str | None:
    """Why a strided view of a storage of `storage_numel` elements is unsafe, or None. Python
    integers: nothing overflows however large the numbers are."""
    if len(shape) != len(stride):
        return f"shape {list(shape)} and stride {list(stride)} have different lengths"
    problem = shape_problem(shape, itemsize)
    if problem:
        return problem
    if any(s < 0 for s in stride):
        return f"a negative stride in {list(stride)}"
    if any(s >= MAX_BYTES for s in stride) or not 0 <= offset < MAX_BYTES:
        return f"stride {list(stride)} or offset {offset} out of range"
    if math.prod(shape) == 0:
        return None if offset <= storage_numel else f"offset {offset} past its storage of {storage_numel} elements"
    last = offset + sum((d - 1) * s for d, s in zip(shape, stride))
    if last >= storage_numel:
        return f"shape {list(shape)}, stride {list(stride)}, offset {offset} reach past its storage of {storage_numel} elements"
    return None  # a view that repeats elements (stride 0, overlapping strides) is valid: torch reads it


def _rebuild_parameter(data=None, requires_grad=False, backward_hooks=None, *rest):
    if not isinstance(data, TensorRecord):
        raise unpickle.Refused("a parameter that holds no tensor")
    return data


class _Reading:
    """The stand-ins for one data.pkl, and what it referred to."""

    def __init__(self):
        self.tensors: list[TensorRecord] = []
        self.storages: dict[str, Storage] = {}
        self.stand_ins = {("collections", "OrderedDict"): unpickle.ordered_dict,
                          ("torch._utils", "_rebuild_tensor_v2"): self.tensor,
                          ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
                          **{("torch", name): StorageType(dtype) for name, dtype in STORAGE_DTYPES.items()}}

    def resolve(self, module: str, name: str):
        return self.stand_ins.get((module, name))

    def tensor(self, storage=None, offset=None, shape=None, stride=None, *rest):  # _rebuild_tensor_v2
        record = TensorRecord(storage, offset, shape, stride)
        self.tensors.append(record)
        return record

    def persistent(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise unpickle.Refused("a persistent id that is not a storage")
        kind, key, location, numel = pid[1], pid[2], pid[3], pid[4]
        if not isinstance(kind, (StorageType, unpickle.Opaque)) or not isinstance(key, str) \
                or not isinstance(location, str):
            raise unpickle.Refused("a storage with an unknown type or key")
        numel = _int(numel, "storage size")
        if isinstance(kind, unpickle.Opaque):
            return unpickle.Opaque(kind.name)
        if numel < 0:
            raise unpickle.Refused(f"storage {quoted(key)} has a negative size")
        known = self.storages.setdefault(key, Storage(kind.dtype, key, numel))
        if (known.dtype, known.numel) != (kind.dtype, numel):
            raise unpickle.Refused(f"storage {quoted(key)} is named with two dtypes or sizes")
        return known


def _member_data_offset(fd: int, info: zipfile.ZipInfo, size: int) -> int | None:
    """Where a stored member's bytes start in the file (after its local header), or None when
    its local header is damaged or its bytes run past the end of the file."""
    header = os.pread(fd, 30, info.header_offset)
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        return None
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    return start if start + info.file_size <= size else None


def _read_pickle(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> bytes:
    if info.file_size > MAX_PICKLE:
        raise _bad(path, f"its {info.filename} declares {info.file_size / 2**20:.0f} MiB "
                         f"(a state dict's is far smaller; at most {MAX_PICKLE >> 20} MiB are read)")
    with archive.open(info) as f:
        data = f.read(MAX_PICKLE + 1)
    if len(data) > MAX_PICKLE:
        raise _bad(path, f"its {info.filename} inflates past {MAX_PICKLE >> 20} MiB")
    return data


class TorchZipSource(Source):
    def __init__(self, path: str, unwrap):
        super().__init__(path)
        self._file = StableFile(path)  # one open file for the zip directory and every storage
        try:
            try:
                archive = self._zip()
            except Exception:  # not a zip Python can read (a legacy pickle, a zip version it lacks): torch decides
                raise NotPlain("not a zip file") from None
            with archive:
                try:
                    self._open(archive, unwrap)
                except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, ValueError, OSError) as exc:
                    self._file.check_unchanged()
                    raise _bad(path, f"its zip structure is damaged ({type(exc).__name__}: {exc})") from None
        except BaseException:
            self._file.close()
            raise

    def _zip(self) -> zipfile.ZipFile:
        return zipfile.ZipFile(os.fdopen(os.dup(self._file.fd), "rb"))

    def _open(self, archive: zipfile.ZipFile, unwrap) -> None:
        path = self.path
        members = {i.filename: i for i in archive.infolist()}
        if any(i.flag_bits & 0x1 for i in members.values()):
            raise _bad(path, "it has encrypted members, which torch.save never writes")
        pkl = [n for n in members if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pkl) != 1:
            raise NotPlain("no single data.pkl")
        prefix = pkl[0][: -len("data.pkl")]
        self.order = byte_order(archive, members.get(prefix + "byteorder"), path)
        reading, foreign = _Reading(), []
        try:
            obj, _ = unpickle.load(_read_pickle(archive, members[pkl[0]], path), reading.resolve,
                                   reading.persistent, foreign)
        except unpickle.Refused as exc:
            raise _bad(path, f"its data.pkl is refused: {exc}") from None
        self._members, self._starts = {}, {}
        for key, storage in reading.storages.items():
            info = self._members[key] = self._storage_member(members.get(f"{prefix}data/{key}"), storage)
            if info.compress_type == zipfile.ZIP_STORED:
                self._starts[key] = _member_data_offset(self._file.fd, info, self._file.size)
                if self._starts[key] is None:
                    self._file.check_unchanged()
                    raise _bad(path, f"storage {quoted(key)} has a damaged zip header or runs past the end "
                                     "of the file (truncated)")
        for record in reading.tensors:
            problem = view_problem(record.shape, record.stride, record.offset, record.storage.numel,
                                   dtypes.itemsize(record.storage.dtype))
            if problem:
                raise _bad(path, f"a tensor has {problem}")
        check_repeats(path, ((r.numel, r.storage.numel, dtypes.itemsize(r.storage.dtype)) for r in reading.tensors))
        if foreign:
            raise NotPlain(f"it names {foreign[0]}")
        self._lock = threading.Lock()
        self._checked: set[str] = set()
        self._inflated: tuple[str, bytes] | None = None
        self._reference, self._unwrap = None, unwrap
        self._tensors = unwrap(obj, lambda v: isinstance(v, TensorRecord), path, self.notes)
        for name, record in self._tensors.items():
            self.infos[name] = TensorInfo(name, record.storage.dtype, record.shape)

    def _storage_member(self, info: zipfile.ZipInfo | None, storage: Storage):
        size = storage.numel * dtypes.itemsize(storage.dtype)
        if info is None:
            raise _bad(self.path, f"storage {quoted(storage.key)} has no data/{storage.key} member")
        if info.file_size != size:
            raise _bad(self.path, f"storage {quoted(storage.key)} is {info.file_size} bytes, "
                                  f"its tensors need {size}")
        if info.compress_type == zipfile.ZIP_DEFLATED:
            if size > MAX_INFLATED or size > DEFLATE_RATIO * info.compress_size + (1 << 16):
                raise _bad(self.path, f"storage {quoted(storage.key)} is deflated to {info.compress_size} bytes "
                                      f"from {size}; re-save it with torch.save, which stores storages uncompressed")
        elif info.compress_type != zipfile.ZIP_STORED:
            raise _bad(self.path, f"storage {quoted(storage.key)} is compressed with method {info.compress_type}")
        return info

    # ---- reading tensors

    def _storage(self, key: str, dtype: np.dtype, numel: int) -> np.ndarray:
        """The storage's elements: read with pread (stored; see stable.py) or inflated (deflated);
        its CRC is checked the first time."""
        info = self._members[key]
        if info.compress_type == zipfile.ZIP_DEFLATED:
            with self._lock:
                if self._inflated is None or self._inflated[0] != key:
                    self._inflated = (key, self._inflate(info))
                return np.frombuffer(self._inflated[1], dtype=dtype, count=numel)
        flat = self._file.array(key, self._starts[key], dtype, numel)
        if key not in self._checked:
            if crc32(flat.view(np.uint8)) != info.CRC:
                self._file.check_unchanged()  # bytes rewritten meanwhile are a change, not corruption
                raise _bad(self.path, f"storage {quoted(key)} fails its CRC check (the file is corrupt)")
            self._checked.add(key)
        return flat

    def _inflate(self, info: zipfile.ZipInfo) -> bytes:
        try:
            with self._zip() as archive, archive.open(info) as f:
                data = f.read(info.file_size + 1)  # zipfile checks the CRC at the end
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError, RuntimeError, OSError) as exc:
            self._file.check_unchanged()
            raise _bad(self.path, f"a deflated storage does not inflate cleanly ({type(exc).__name__}: {exc})") from None
        if len(data) != info.file_size:
            raise _bad(self.path, f"a deflated storage inflates to {len(data)} bytes, not {info.file_size}")
        return data

    def read(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        dtype = dtypes.storage(t.storage.dtype)
        flat = self._storage(t.storage.key, dtype, t.storage.numel)
        return valid_bools(self.path, name, strided(flat, t.offset, t.shape, t.stride, self.order))

    def byte_range(self, name: str):
        """A stored storage's bytes, where they are in this machine's byte order and the tensor
        views them in C order. The storage's CRC is checked first (it is read for that, once),
        so that a corrupt member is refused as `read` refuses it."""
        t = self._tensors[name]
        itemsize = dtypes.itemsize(t.storage.dtype)
        start = self._starts.get(t.storage.key)
        native = itemsize == 1 or self.order == ("<" if sys.byteorder == "little" else ">")
        if start is None or not native or not c_ordered(t.shape, t.stride):
            return None
        if t.storage.key not in self._checked:
            self._storage(t.storage.key, dtypes.storage(t.storage.dtype), t.storage.numel)
        return self._file, start + t.offset * itemsize, t.numel * itemsize

    def reference(self, name: str) -> np.ndarray:
        """The tensor decoded independently of `read` (torch_reference.py), for the self-check."""
        with self._lock:
            if self._reference is None:
                from .torch_reference import TorchZipReference
                try:
                    self._reference = TorchZipReference(self._file.fd, self.path, self._unwrap)
                except Exception as exc:  # the two decodings disagree on the file's structure
                    self._second_reading_failed(exc)
        try:
            return self._reference.read(name)
        except UserError:  # a storage that ends early: the file's fault, or the file changed under the check
            self._file.check_unchanged()
            raise
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError) as exc:  # a member's header or data
            self._second_reading_failed(exc)  # unreadable now: truncated under the check, or damaged

    def _second_reading_failed(self, exc: BaseException):
        self._file.check_unchanged()  # a file changed under the reading is said as that
        raise CheckFailed(f"{quoted(self.path)} decodes differently by a second reading "
                          f"({type(exc).__name__}: {exc}); nothing was written") from None

    def close(self) -> None:
        if getattr(self, "_reference", None) is not None:
            self._reference.close()
        self._file.close()
