"""Inside a rank: which object each quantity is read from (grader/processes/values.py `unpack_returned`,
`select`), on synthetic returns; no process is started. The rule, as students read it: a dict by its keys, a
tuple or list as long as the quantities by position, a lone tensor for one quantity; otherwise a returned
tensor counts for the quantity whose variable it is (or a slice or view of), and for one quantity the one
tensor returned; what is left is read from the entry function's variables of those names."""
from __future__ import annotations

import collections
import time

import torch
from torch.overrides import TorchFunctionMode

from grader.processes import values
from grader.processes.values import select, unpack_returned

TWO = ["params", "momentum"]
ONE = ["grad"]


def test_nothing_returned_is_read_from_the_locals():
    assert unpack_returned(None, TWO, {"params": torch.zeros(2)}) is None
    assert select(None, {"params": 1}, TWO) == ({"params": 1, "momentum": None}, {"params": "locals", "momentum": "locals"})
    for odd in (3.5, "text", object(), {1, 2}, b"xy", range(3)):
        assert unpack_returned(odd, TWO, {}) is None and unpack_returned(odd, ONE, {}) is None


def test_a_dict_is_read_by_name_and_what_it_lacks_from_the_locals():
    p, m, local_m = torch.ones(3), torch.zeros(2), torch.full((2,), 7.0)
    assert unpack_returned({"params": p, "momentum": m, "rank": 0}, TWO) == {"params": p, "momentum": m}
    assert unpack_returned({"params": p}, TWO, {"momentum": local_m}) == {"params": p}
    chosen, sources = select({"params": p, "momentum": None}, {"params": m, "momentum": local_m}, TWO)
    assert chosen["params"] is p and chosen["momentum"] is local_m       # None: not returned
    assert sources == {"params": "return", "momentum": "locals"}
    assert unpack_returned({"gradient": p}, ONE, {"grad": m}) is None    # no key of that name: its variable
    assert unpack_returned({}, ONE) is None


def test_a_tuple_or_list_as_long_as_the_quantities_is_read_by_position():
    a, b = torch.ones(2), torch.zeros(3)
    for returned in ((a, b), [a, b], collections.namedtuple("Results", "x y")(a, b)):
        assert unpack_returned(returned, TWO, {"params": b, "momentum": a}) == {"params": a, "momentum": b}
    # swapped values stay swapped: the order is the declaration's (the report then names the swap)
    assert unpack_returned((b, a), TWO, {"params": a, "momentum": b}) == {"params": b, "momentum": a}
    assert unpack_returned((a,), ONE) == {"grad": a} and unpack_returned([a], ONE) == {"grad": a}
    # an item that is None is not returned: that quantity is read from its variable
    assert select((a, None), {"momentum": b}, TWO) == ({"params": a, "momentum": b},
                                                       {"params": "return", "momentum": "locals"})
    assert unpack_returned((None, None), TWO, {}) is None


def test_one_quantity_is_a_lone_tensor_or_the_one_tensor_among_the_returned_values():
    grad, loss = torch.ones(4, 8), torch.tensor(0.5)
    assert unpack_returned(grad, ONE) == {"grad": grad}
    # `return grad, total_loss` (a float): the one tensor, whatever the variables hold
    assert unpack_returned((grad, 1.25), ONE, {}) == {"grad": grad}
    assert unpack_returned((grad, 1.25), ONE, {"grad": torch.zeros(4, 8)}) == {"grad": grad}
    assert unpack_returned((3, [1.0], grad, "logged"), ONE) == {"grad": grad}
    # two tensors: the one that is the variable grad (or a view of it) ...
    assert unpack_returned((loss, grad), ONE, {"grad": grad}) == {"grad": grad}
    assert unpack_returned((grad[0:2], loss), ONE, {"grad": grad})["grad"] is not None
    # ... else the tensor at its position: what the code returns counts, whatever its variables hold (a bug
    # in the return expression is judged, not hidden behind a right variable)
    other = torch.ones(4, 8)
    assert unpack_returned((other, loss), ONE, {"grad": grad}) == {"grad": other}
    assert select((other, loss), {"grad": grad}, ONE) == ({"grad": other}, {"grad": "return"})
    assert unpack_returned((other, loss), ONE, {})["grad"] is other
    # with no tensor there and no variable, what was returned (judged as it is: not a tensor)
    returned = ([1.0], loss.item())
    assert unpack_returned(returned, ONE, {})["grad"] is returned
    assert unpack_returned((), ONE, {})["grad"] == ()
    # chunks of the variable returned as a list: several tensors are that variable, so the one at its position
    chunks = list(grad.view(-1).chunk(4))
    assert unpack_returned(chunks, ONE, {"grad": grad}) == {"grad": chunks[0]}
    # the same tensor twice is still one tensor
    assert unpack_returned((grad, grad, 2), ONE, {}) == {"grad": grad}


def test_a_lone_tensor_for_several_quantities_is_the_one_whose_variable_it_is_or_slices():
    padded = torch.zeros(1032)
    momentum = torch.ones(516)
    local = {"params": padded, "momentum": momentum}
    returned = padded[:1030]
    assert unpack_returned(returned, TWO, local) == {"params": returned}
    chosen, sources = select(returned, local, TWO)
    assert chosen["params"] is returned and chosen["momentum"] is momentum
    assert sources == {"params": "return", "momentum": "locals"}
    for view in (padded.detach(), padded.view(4, 258), padded.narrow(0, 2, 10), padded.data):
        assert unpack_returned(view, TWO, local) == {"params": view}
    assert unpack_returned(momentum, TWO, local) == {"momentum": momentum}
    # a copy, a tensor of neither variable, or a tensor with no variables to compare: the locals, as before
    assert unpack_returned(padded[:1030].clone(), TWO, local) is None
    assert unpack_returned(torch.tensor(0.25), TWO, local) is None
    assert unpack_returned(returned, TWO, {}) is None and unpack_returned(returned, TWO) is None


def test_a_tuple_of_another_length_pairs_its_tensors_with_the_variables_one_to_one():
    gradient, gathered = torch.ones(8), torch.zeros(4)
    local = {"gradient": gradient, "full_feature": gathered}
    names = ["gradient", "full_feature"]
    # extra values after the answers: each returned variable counts, and a fresh tensor at its position
    view = gathered[:]
    assert unpack_returned((gradient, view, 12.5), names, local) == {"gradient": gradient, "full_feature": view}
    fresh = torch.cat([gathered])
    assert unpack_returned((gradient, fresh, 12.5), names, local) == {"gradient": gradient, "full_feature": fresh}
    # two returned tensors are the same variable: by position, then
    first, second = gradient[:4], gradient[4:]
    assert unpack_returned((first, second, 1), names, local) == {"gradient": first, "full_feature": second}
    # both quantities' variables views of one buffer: a view of the buffer is either, so neither ...
    flat = torch.zeros(12)
    shared = {"gradient": flat[:8], "full_feature": flat[8:]}
    assert unpack_returned(flat[:2], names, shared) is None
    # ... but a returned variable itself is that variable
    assert unpack_returned((shared["gradient"],), names, shared) == {"gradient": shared["gradient"]}
    # meta and empty tensors have no memory to compare: the one returned at the position is judged as it is
    meta = {"gradient": torch.zeros(3, device="meta"), "full_feature": None}
    returned_meta = torch.zeros(3, device="meta")
    assert unpack_returned((returned_meta, 1, 2), names, meta) == {"gradient": returned_meta}
    empty = {"gradient": torch.zeros(0), "full_feature": None}
    returned_empty = torch.zeros(0)
    assert unpack_returned((returned_empty, 1, 2), names, empty) == {"gradient": returned_empty}


def test_the_legacy_call_without_locals_keeps_the_old_reading():
    """Called without the locals: a lone tensor for several quantities gives nothing (all read from the
    locals); a tuple of another length, its tensors by position; for one quantity, the one tensor, else what
    was returned."""
    t = torch.ones(2)
    assert unpack_returned(t, TWO) is None
    u = t + 1
    assert unpack_returned((t, u, 3), TWO) == {"params": t, "momentum": u}
    assert unpack_returned((t, 3), ONE) == {"grad": t}
    pair = (t, t + 1)
    assert unpack_returned(pair, ONE)["grad"] is t   # two tensors: the one at its position


# -- hostile objects -------------------------------------------------------------------------------

class Boom(Exception):
    pass


def test_container_subclasses_are_read_through_the_builtin_methods():
    t, u = torch.ones(2), torch.zeros(2)

    class LyingDict(dict):
        def __getitem__(self, key):
            raise Boom

        def get(self, *a):
            raise Boom

        def __contains__(self, key):
            raise Boom

        def __missing__(self, key):
            raise Boom

        def keys(self):
            raise Boom

    class LyingList(list):
        def __len__(self):
            raise Boom

        def __iter__(self):
            raise Boom

        def __getitem__(self, i):
            return "a lie"

    class LyingTuple(tuple):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            raise Boom

    assert unpack_returned(LyingDict(params=t), TWO, {}) == {"params": t}
    assert unpack_returned(LyingList([t, u]), TWO, {}) == {"params": t, "momentum": u}
    assert unpack_returned(LyingTuple((t, u)), TWO, {}) == {"params": t, "momentum": u}
    assert unpack_returned(LyingTuple((t, 5, "x")), ONE, {}) == {"grad": t}


def test_a_key_that_raises_or_a_generator_gives_nothing_and_never_raises():
    class Collides:
        def __hash__(self):
            return hash("params")

        def __eq__(self, other):
            raise Boom

    assert unpack_returned({Collides(): 1}, TWO, {"params": torch.ones(1)}) is None
    ran = []

    def gen():
        ran.append(1)
        yield torch.ones(2)

    assert unpack_returned(gen(), ONE, {}) is None and unpack_returned(gen(), TWO, {}) is None
    assert ran == []   # never iterated
    assert unpack_returned(iter([torch.ones(2)]), ONE, {}) is None


def test_a_huge_tuple_is_never_looked_through():
    huge = (torch.ones(2),) + (0,) * 1_000_000
    start = time.perf_counter()
    assert unpack_returned(huge, ONE, {})["grad"] is huge       # no variable: what was returned (not a tensor)
    assert unpack_returned(huge, ONE, {"grad": torch.ones(2)}) is None
    assert unpack_returned(huge, TWO, {"params": huge[0]}) is None
    assert time.perf_counter() - start < 1.0
    scanned = (torch.ones(2),) + (0,) * (values.MAX_SCANNED - 1)
    assert unpack_returned(scanned, ONE, {})["grad"] is scanned[0]


def test_tensor_subclasses_are_never_asked_anything():
    calls = []

    class Agreeable(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            calls.append(func)
            raise Boom

    base = torch.zeros(6)
    fake = base.as_subclass(Agreeable)
    calls.clear()
    # a subclass returned alone for one quantity is that quantity (describe() judges its type)
    assert unpack_returned(fake, ONE, {}) == {"grad": fake}
    # for several quantities it shares memory with the variable params, but only a plain tensor's memory is
    # compared: it counts only where it is the variable itself
    assert unpack_returned(fake, TWO, {"params": base}) is None
    assert unpack_returned(fake, TWO, {"params": fake}) == {"params": fake}
    assert unpack_returned((fake, 1.0), ONE, {}) == {"grad": fake}
    assert calls == []


def test_a_students_torch_function_mode_changes_nothing():
    class Raising(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            raise Boom

    padded, momentum = torch.zeros(8), torch.ones(2)
    view = padded[:6]
    with Raising():
        assert unpack_returned(view, TWO, {"params": padded, "momentum": momentum}) == {"params": view}
        assert unpack_returned((momentum, 1.0), ONE, {}) == {"grad": momentum}
