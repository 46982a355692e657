"""Names of variables, placeholders and constants, and K.name_scope, as TensorFlow 1's.

The expected names are written out by hand from TensorFlow 1's rules
(``Graph.name_scope``, ``Graph.unique_name``): each test opens a scope of its own,
so the names made in other tests cannot change them.
"""
import re
import threading

import numpy as np
import pytest

import numbackend as K
from numbackend import names


def test_named_leaves_carry_the_scope_and_end_in_colon_zero():
    with K.name_scope("test_names_leaves") as scope:
        v = K.variable(np.zeros(2), name="kernel")
        p = K.placeholder((None, 2), name="x")
        c = K.constant(1.0, name="c")
        z = K.zeros((2,), name="z")
        anonymous = [K.variable(0.0), K.placeholder((1,)), K.constant(0.0)]
    assert scope == "test_names_leaves/"
    assert [v.name, p.name, c.name, z.name] == [
        "test_names_leaves/kernel:0", "test_names_leaves/x:0", "test_names_leaves/c:0",
        "test_names_leaves/z:0"]
    assert [t.name for t in anonymous] == [
        "test_names_leaves/Variable:0", "test_names_leaves/Placeholder:0",
        "test_names_leaves/Const:0"]


def test_repeated_names_get_a_number_as_in_tensorflow():
    with K.name_scope("test_names_repeated"):
        first = K.variable(0.0, name="w")
        second = K.variable(0.0, name="w")
        own = K.variable(0.0, name="w_2")     # taken as a name of its own...
        third = K.variable(0.0, name="w")     # ...so the third 'w' skips it
        upper = K.variable(0.0, name="W")     # names are compared without case
        unnamed = [K.variable(0.0).name for _ in range(3)]
    prefix = "test_names_repeated/"
    assert [first.name, second.name, own.name, third.name, upper.name] == [
        prefix + "w:0", prefix + "w_1:0", prefix + "w_2:0", prefix + "w_3:0", prefix + "W_4:0"]
    assert unnamed == [prefix + "Variable:0", prefix + "Variable_1:0", prefix + "Variable_2:0"]


def test_name_scope_nests_and_reopens_as_tensorflow():
    with K.name_scope("test_names_outer") as outer:
        with K.name_scope("inner") as inner:
            a = K.variable(0.0, name="a")
        with K.name_scope("inner") as inner_again:    # a second 'inner' is another scope
            b = K.variable(0.0, name="a")
        with K.name_scope("test_names_outer/inner/") as absolute:   # trailing '/': as it is
            c = K.variable(0.0, name="a")
        with K.name_scope("") as root, K.name_scope(None) as root_too:
            d = K.variable(0.0, name="test_names_root")
        e = K.variable(0.0, name="test_names_fixed/")            # trailing '/': as it is
    with K.name_scope("test_names_outer") as outer_again:
        pass
    assert (outer, inner, inner_again, absolute, root, root_too) == (
        "test_names_outer/", "test_names_outer/inner/", "test_names_outer/inner_1/",
        "test_names_outer/inner/", "", "")
    assert outer_again == "test_names_outer_1/"
    assert [a.name, b.name, c.name, d.name, e.name] == [
        "test_names_outer/inner/a:0", "test_names_outer/inner_1/a:0",
        "test_names_outer/inner/a_1:0", "test_names_root:0", "test_names_fixed:0"]
    assert names.current_scope() == ""


def test_name_scope_is_left_on_an_exception():
    try:
        with K.name_scope("test_names_raises"):
            raise KeyError("boom")
    except KeyError:
        pass
    assert names.current_scope() == ""


def test_name_scope_is_per_thread():
    seen = {}
    inside, leave = threading.Event(), threading.Event()

    def other():
        with K.name_scope("test_names_thread_b"):
            inside.set()
            leave.wait(10)
            seen["b"] = K.variable(0.0, name="v").name

    with K.name_scope("test_names_thread_a"):
        thread = threading.Thread(target=other)
        thread.start()
        inside.wait(10)
        seen["a"] = K.variable(0.0, name="v").name
        leave.set()
        thread.join(10)
    assert seen == {"a": "test_names_thread_a/v:0", "b": "test_names_thread_b/v:0"}


def test_clear_session_frees_the_names():
    with K.name_scope("test_names_session") as before:
        K.variable(0.0, name="v")
    K.clear_session()
    with K.name_scope("test_names_session") as after:
        v = K.variable(0.0, name="v")
    assert before == after == "test_names_session/"
    assert v.name == "test_names_session/v:0"


def test_a_name_must_be_a_string():
    for bad in (3, 1.5, ["w"]):
        with pytest.raises(TypeError, match=r"variable: .*" + re.escape(repr(bad))):
            K.variable(0.0, name=bad)
    with pytest.raises(TypeError, match="name_scope: .*3"), K.name_scope(3):
        pass
    with K.name_scope(b"test_names_bytes") as scope:
        assert scope == "test_names_bytes/"
