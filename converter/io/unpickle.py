"""A pickle reader that builds data and nothing else.

Python's own unpickler imports whatever a pickle names, calls it, hashes any object used as a
dict key (a nested tuple shared with itself hashes for ever), and sizes its memo by the largest
index a pickle names. This one interprets the opcodes itself: strings, bytes, numbers, tuples,
lists, dicts and sets; a global is looked up in the caller's table of stand-ins (nothing is
imported) and a persistent id handed to the caller. Dict keys and set items must be strings or
integers; the memo, the nesting depth and every length are capped and checked against the
bytes that are really there.

A global the table does not know either stops the read (`Refused`) or, when the caller asks
for it, becomes an `Opaque` placeholder so that the whole pickle is still checked and the
caller learns every foreign name it holds.
"""

from __future__ import annotations

import collections
import struct
from dataclasses import dataclass

from ..errors import one_line


class Refused(Exception):
    """The pickle is malformed, or holds something this reader never builds."""


@dataclass(frozen=True)
class Limits:
    memo: int = 1 << 21  # entries
    depth: int = 200  # containers inside containers
    long_bytes: int = 64  # the size of one encoded integer
    global_text: int = 256  # the length of a module or class name


LIMITS = Limits()


class Opaque:
    """Something a pickle names that this reader does not build (see `load(foreign=...)`)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


def ordered_dict(*args):
    """The stand-in for collections.OrderedDict: an empty one, as a state dict's pickle builds it."""
    if args:
        raise Refused("an OrderedDict built with arguments")
    return collections.OrderedDict()


_CONTAINER_TYPES = frozenset({tuple, list, dict, set, frozenset, collections.OrderedDict})
_I4, _U2, _U4, _U8, _F8 = (struct.Struct(f) for f in ("<i", "<H", "<I", "<Q", ">d"))


class _Machine:
    def __init__(self, data, position: int, resolve, persistent, foreign, limits: Limits):
        self.data = memoryview(data).cast("B")
        self.pos = position
        self.resolve = resolve
        self.persistent = persistent
        self.foreign = foreign  # None: refuse unknown globals; a list: collect their names
        self.limits = limits
        self.stack: list = []
        self.marks: list[int] = []
        self.memo: dict[int, object] = {}
        self.depths: dict[int, int] = {}  # id -> depth, for containers that hold containers
        self.keep: list = []  # keeps those containers alive, so that their ids stay theirs

    # ---- reading the byte stream

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise Refused(f"it ends inside an opcode's data (needs {n} bytes at byte {self.pos})")
        view = self.data[self.pos:self.pos + n]
        self.pos += n
        return view

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise Refused("it ends inside an opcode's data")
        self.pos += 1
        return self.data[self.pos - 1]

    def unpack(self, fmt: struct.Struct):
        if self.pos + fmt.size > len(self.data):
            raise Refused(f"it ends inside an opcode's data (needs {fmt.size} bytes at byte {self.pos})")
        value = fmt.unpack_from(self.data, self.pos)[0]
        self.pos += fmt.size
        return value

    def line(self) -> str:
        end = self.pos
        limit = min(len(self.data), self.pos + self.limits.global_text + 1)
        while end < limit and self.data[end] != 0x0A:
            end += 1
        if end >= limit:
            raise Refused(f"a global name at byte {self.pos} is not a short line")
        try:
            text = bytes(self.data[self.pos:end]).decode("utf-8", "strict")
        except UnicodeDecodeError:
            raise Refused(f"a global name at byte {self.pos} that is not UTF-8") from None
        self.pos = end + 1
        return text

    # ---- the stack

    def pop(self):
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise Refused("an opcode takes more items than are on its stack")
        return self.stack.pop()

    def pop_mark(self) -> list:
        if not self.marks:
            raise Refused("an opcode needs a MARK that is not there")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def top(self):
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise Refused("an opcode needs an item that is not on its stack")
        return self.stack[-1]

    # ---- containers

    def deepen(self, container, items) -> None:
        """Record how deep `container` nests now that it holds `items`. Only containers that
        hold containers are recorded; any other container is 1 deep."""
        inner = 0
        for item in items:
            if type(item) in _CONTAINER_TYPES:
                d = self.depths.get(id(item), 1)
                if d > inner:
                    inner = d
        if not inner or inner + 1 <= self.depths.get(id(container), 1):
            return
        if inner + 1 > self.limits.depth:
            raise Refused(f"it nests containers more than {self.limits.depth} deep")
        if id(container) not in self.depths:
            self.keep.append(container)  # alive until the end, so that its id stays its own
        self.depths[id(container)] = inner + 1

    def built(self, container):
        self.deepen(container, container.values() if isinstance(container, dict) else container)
        self.stack.append(container)

    def key(self, key):
        if isinstance(key, (str, int)) and not isinstance(key, bool):
            return key
        raise Refused(f"a dict key or set item is a {type(key).__name__}, not a string or an integer")

    def set_items(self, target, items: list) -> None:
        if len(items) % 2:
            raise Refused("SETITEMS with an odd number of items")
        if isinstance(target, Opaque):
            for k in items[::2]:
                self.key(k)
            return
        if not isinstance(target, dict):
            raise Refused(f"items set on a {type(target).__name__}")
        for k, v in zip(items[::2], items[1::2]):
            target[self.key(k)] = v
        self.deepen(target, items[1::2])

    def add_items(self, target, items: list) -> None:
        if not isinstance(target, set):
            raise Refused(f"set items added to a {type(target).__name__}")
        target.update(self.key(i) for i in items)

    def append(self, target, items: list) -> None:
        if isinstance(target, Opaque):
            return
        if not isinstance(target, list):
            raise Refused(f"items appended to a {type(target).__name__}")
        target.extend(items)
        self.deepen(target, items)

    # ---- names and calls

    def find(self, module, name):
        if not isinstance(module, str) or not isinstance(name, str):
            raise Refused("a global whose module or name is not a string")
        found = self.resolve(module, name)
        if found is not None:
            return found
        where = f"{module}.{name}"
        if self.foreign is None:
            raise Refused(f"it asks to import {one_line(where)[:200]}")
        self.foreign.append(where)
        return Opaque(where)

    def call(self, func, args):
        if not isinstance(args, tuple):
            raise Refused("a call whose arguments are not a tuple")
        if isinstance(func, Opaque) or any(isinstance(a, Opaque) for a in args):
            return Opaque(func.name if isinstance(func, Opaque) else "call")
        if not callable(func):
            raise Refused(f"it calls a {type(func).__name__}")
        return func(*args)

    def build(self, target, state) -> None:
        if isinstance(target, Opaque):
            return
        if isinstance(target, type):
            raise Refused(f"state set on the class {target.__name__} itself")
        apply = getattr(target, "set_state", None)
        if apply is not None:
            apply(state)
        elif isinstance(target, dict) and (state is None or isinstance(state, dict)):
            for k in (state or {}):  # a state dict's attributes (torch's _metadata): checked, not kept
                self.key(k)
        else:
            raise Refused(f"state set on a {type(target).__name__}")

    def memo_put(self, index: int) -> None:
        if len(self.memo) >= self.limits.memo and index not in self.memo:
            raise Refused(f"its memo holds more than {self.limits.memo} entries")
        self.memo[index] = self.top()

    def memo_get(self, index: int):
        if index not in self.memo:
            raise Refused(f"it refers to memo entry {index}, which was never stored")
        self.stack.append(self.memo[index])

    def long(self, n: int) -> int:
        if n > self.limits.long_bytes:
            raise Refused(f"an integer of {n} bytes")
        return int.from_bytes(self.take(n), "little", signed=True)

    def text(self, n: int) -> str:
        try:
            return bytes(self.take(n)).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise Refused("a string that is not UTF-8") from None

    # ---- the loop

    def run(self):
        ops = _OPS
        while True:
            if self.pos >= len(self.data):
                raise Refused("it ends before its STOP opcode")
            code = self.data[self.pos]
            self.pos += 1
            if code == 0x2E:  # STOP
                if len(self.stack) != 1 or self.marks:
                    raise Refused("it stops with an unbalanced stack")
                return self.stack.pop()
            handler = ops.get(code)
            if handler is None:
                raise Refused(f"opcode {bytes([code])!r} at byte {self.pos - 1}, which data pickles do not use")
            handler(self)


def _op_proto(m):
    if m.byte() > 5:
        raise Refused("an unknown pickle protocol")


def _popped(n):
    """The top `n` items, popped, in their order on the stack."""
    return lambda m: [m.pop() for _ in range(n)][::-1]


def _op_tuple(n):
    take = _popped(n)
    return lambda m: m.built(tuple(take(m)))


def _onto_top(take, apply):
    """An opcode that takes items off the stack (`take`) and applies them to the item below them."""
    def op(m):
        items = take(m)
        apply(m, m.top(), items)
    return op


def _op_stack_global(m):
    name = m.pop()
    module = m.pop()
    m.stack.append(m.find(module, name))


def _op_call(m):  # REDUCE and NEWOBJ
    args = m.pop()
    func = m.pop()
    m.stack.append(m.call(func, args))


def _op_newobj_ex(m):
    kwargs = m.pop()
    args = m.pop()
    cls = m.pop()
    if kwargs:
        raise Refused("an object built with keyword arguments")
    m.stack.append(m.call(cls, args))


def _op_persid(m):
    pid = m.pop()
    if m.persistent is None:
        raise Refused("it uses persistent ids")
    m.stack.append(m.persistent(pid))


def _op_dict(m):
    items = m.pop_mark()
    target = {}
    m.set_items(target, items)
    m.built(target)


def _op_frozenset(m):
    items = m.pop_mark()
    m.built(frozenset(m.key(i) for i in items))


def _op_pop(m):
    if m.marks and len(m.stack) == m.marks[-1]:
        m.marks.pop()
    else:
        m.pop()


_OPS = {
    0x80: _op_proto,
    0x95: lambda m: m.take(8),  # FRAME: the data is read whole, frames need nothing
    0x28: lambda m: m.marks.append(len(m.stack)),  # MARK
    0x30: _op_pop,  # POP
    0x31: lambda m: m.pop_mark(),  # POP_MARK
    0x32: lambda m: m.stack.append(m.top()),  # DUP
    0x4E: lambda m: m.stack.append(None),  # NONE
    0x88: lambda m: m.stack.append(True),  # NEWTRUE
    0x89: lambda m: m.stack.append(False),  # NEWFALSE
    0x4A: lambda m: m.stack.append(m.unpack(_I4)),  # BININT
    0x4B: lambda m: m.stack.append(m.byte()),  # BININT1
    0x4D: lambda m: m.stack.append(m.unpack(_U2)),  # BININT2
    0x8A: lambda m: m.stack.append(m.long(m.byte())),  # LONG1
    0x8B: lambda m: m.stack.append(m.long(m.unpack(_I4))),  # LONG4
    0x47: lambda m: m.stack.append(m.unpack(_F8)),  # BINFLOAT
    0x58: lambda m: m.stack.append(m.text(m.unpack(_U4))),  # BINUNICODE
    0x8C: lambda m: m.stack.append(m.text(m.byte())),  # SHORT_BINUNICODE
    0x8D: lambda m: m.stack.append(m.text(m.unpack(_U8))),  # BINUNICODE8
    0x42: lambda m: m.stack.append(m.take(m.unpack(_U4))),  # BINBYTES
    0x43: lambda m: m.stack.append(m.take(m.byte())),  # SHORT_BINBYTES
    0x8E: lambda m: m.stack.append(m.take(m.unpack(_U8))),  # BINBYTES8
    0x29: lambda m: m.built(()),  # EMPTY_TUPLE
    0x74: lambda m: m.built(tuple(m.pop_mark())),  # TUPLE
    0x85: _op_tuple(1),
    0x86: _op_tuple(2),
    0x87: _op_tuple(3),
    0x5D: lambda m: m.built([]),  # EMPTY_LIST
    0x6C: lambda m: m.built(list(m.pop_mark())),  # LIST
    0x61: _onto_top(_popped(1), _Machine.append),  # APPEND
    0x65: _onto_top(_Machine.pop_mark, _Machine.append),  # APPENDS
    0x7D: lambda m: m.built({}),  # EMPTY_DICT
    0x64: _op_dict,
    0x73: _onto_top(_popped(2), _Machine.set_items),  # SETITEM
    0x75: _onto_top(_Machine.pop_mark, _Machine.set_items),  # SETITEMS
    0x8F: lambda m: m.built(set()),  # EMPTY_SET
    0x90: _onto_top(_Machine.pop_mark, _Machine.add_items),  # ADDITEMS
    0x91: _op_frozenset,
    0x71: lambda m: m.memo_put(m.byte()),  # BINPUT
    0x72: lambda m: m.memo_put(m.unpack(_U4)),  # LONG_BINPUT
    0x94: lambda m: m.memo_put(len(m.memo)),  # MEMOIZE
    0x68: lambda m: m.memo_get(m.byte()),  # BINGET
    0x6A: lambda m: m.memo_get(m.unpack(_U4)),  # LONG_BINGET
    0x63: lambda m: m.stack.append(m.find(m.line(), m.line())),  # GLOBAL: module and name, a line each
    0x93: _op_stack_global,
    0x52: _op_call,  # REDUCE
    0x81: _op_call,  # NEWOBJ
    0x92: _op_newobj_ex,
    0x62: _onto_top(_Machine.pop, _Machine.build),  # BUILD
    0x51: _op_persid,
}


def load(data, resolve, persistent=None, foreign: list | None = None, position: int = 0,
         limits: Limits = LIMITS):
    """(object, position after its STOP) of the pickle in `data` (bytes, mmap or memoryview)
    starting at `position`. `resolve(module, name)` gives the stand-in for a global, or None;
    `persistent(pid)` the object for a persistent id. With `foreign` (a list), unknown globals
    become Opaque and their names are added to it; without it they are refused."""
    machine = _Machine(data, position, resolve, persistent, foreign, limits)
    try:
        return machine.run(), machine.pos
    except (RecursionError, MemoryError, OverflowError) as exc:
        raise Refused(f"{type(exc).__name__} while reading it") from None
