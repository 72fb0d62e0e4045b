"""A function replaced for one thread alone (converter/patches.py): the other threads keep the
original while it lasts, two threads that patch in turn each see their own, and the last thread
out puts the original back whatever order they leave in."""

import threading
import types

import pytest

from converter.patches import thread_patch


def _namespace():
    return types.SimpleNamespace(f=lambda x: x + 1)


def test_other_threads_keep_the_original_and_the_last_out_puts_it_back():
    ns = _namespace()
    original = ns.f
    patch = thread_patch(ns, "f")
    seen = {}
    a_in, b_out = threading.Event(), threading.Event()

    def a():  # patches first, leaves last
        with patch.patched(lambda o: (lambda x: o(x) * 10)):
            a_in.set()
            b_out.wait(5)
            seen["a"] = ns.f(1)

    def b():  # reads beside a's patch, then patches and leaves first
        a_in.wait(5)
        seen["b, unpatched"] = ns.f(1)
        with patch.patched(lambda o: (lambda x: -o(x))):
            seen["b"] = ns.f(1)
        seen["b, after"] = ns.f(1)
        b_out.set()
    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"b, unpatched": 2, "b": -2, "b, after": 2, "a": 20}
    assert ns.f is original


def test_nested_patches_stack_on_a_thread_and_an_error_leaves_nothing_behind():
    ns = _namespace()
    original = ns.f
    patch = thread_patch(ns, "f")
    with pytest.raises(ValueError):
        with patch.patched(lambda o: (lambda x: o(x) * 10)):
            with patch.patched(lambda o: (lambda x: o(x) + 100)):
                assert ns.f(1) == 102  # each patch wraps the original
            assert ns.f(1) == 20
            raise ValueError("the work failed")
    assert ns.f is original and ns.f(1) == 2


def test_a_method_patched_on_a_class_binds_as_the_original():
    class Thing:
        def value(self, x):
            return x

    patch = thread_patch(Thing, "value")
    with patch.patched(lambda original: (lambda self, x: original(self, x) * 3)):
        assert Thing().value(2) == 6
    assert Thing().value(2) == 2 and "value" in vars(Thing) and Thing.value.__name__ == "value"
