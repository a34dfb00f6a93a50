"""What a student's code gets of torch.distributed inside a rank: the grader owns the process group, so a
student's own init_process_group joins it, destroy_process_group leaves it be, a group the student makes
is made on the run's backend, monitored_barrier works on the switch's group, and a store the student makes
in a graded run is an in-process one (the switch is the only way to another rank). Installed once, in the
zygote; torch's originals are kept in ORIGINALS for the grader's own use.
"""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import backend
from .backend import Link
from .channel import Channel

LINK: Link | None = None        # this process's rank (rank.RankLink), once it has joined its run's group
CHANNEL: Channel | None = None  # its socket to the supervisor, once its run has begun; None in the zygote


def _note(what: str) -> None:
    if CHANNEL is not None:
        CHANNEL.send({"t": "note", "what": what})


def _student_init_process_group(*args, **kwargs):
    """The grader owns the process group: a student's own init (fixed port and all) joins it instead (in a
    graded run, where the submission's top level runs before the group exists, as under plain Python before
    init_process_group: an init there makes none)."""
    if CHANNEL is not None:
        _note("init_process_group")
        return None
    return ORIGINALS["init_process_group"](*args, **kwargs)


def _student_destroy_process_group(group=None):
    if CHANNEL is not None and group is None:
        _note("destroy_process_group")
        return None
    return ORIGINALS["destroy_process_group"](group)


def _student_new_group(*args, **kwargs):
    """A group the student makes is made on the run's own backend, whatever backend it names ("gloo"):
    in a graded run, what travels through it goes through the switch like the rest."""
    args = list(args)
    if len(args) > 2:
        args[2] = None
    kwargs.pop("backend", None)
    kwargs.pop("pg_options", None)
    return ORIGINALS["new_group"](*args, **kwargs)


def _student_monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch allows monitored_barrier on gloo only, by its name: on the switch's group it is a barrier."""
    if dist.is_initialized() and dist.get_backend(group) == backend.NAME:
        pg = group if group is not None else c10d._get_default_group()
        return pg.barrier()
    return ORIGINALS["monitored_barrier"](group, timeout, wait_all_ranks)


class _StudentStore(type):
    """`dist.TCPStore` / `dist.FileStore` as a student's code sees them. In a graded run the rank already
    belongs to the grader's group, which a student's init_process_group joins whatever store it is given, and
    the switch is the only way to another rank: a store the student makes is an in-process one there
    (dist.HashStore), which never connects anywhere (a TCPStore would wait for a peer it cannot reach until
    the time limit). Elsewhere (a real-backend run, the zygote) it is torch's own class."""

    def __call__(cls, *args, **kwargs):
        if CHANNEL is None or LINK is None or LINK.spec.get("mode") != "switch":
            return cls.original(*args, **kwargs)
        store = dist.HashStore()
        timeout = kwargs.get("timeout", next((a for a in args if isinstance(a, timedelta)), None))
        if isinstance(timeout, timedelta):   # a key no rank of this process sets: waited for as long as asked
            store.set_timeout(timeout)
        return store

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls.original)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, cls.original)


def _student_store(original: type) -> type:
    return _StudentStore(original.__name__, (), {"original": original, "__doc__": original.__doc__,
                                                 "__module__": original.__module__})


ORIGINALS: dict = {}


def install() -> None:
    """Register the grader's backend and take over init/destroy of the default group, and the stores a
    student makes (`_StudentStore`). Called once, in the zygote; everything a rank imports later is imported
    here first (ranks cannot read the checkout)."""
    backend.install(None)
    if ORIGINALS:
        return
    for name, replacement in (("init_process_group", _student_init_process_group),
                              ("destroy_process_group", _student_destroy_process_group),
                              ("new_group", _student_new_group),
                              ("monitored_barrier", _student_monitored_barrier)):
        ORIGINALS[name] = getattr(c10d, name)
        for module in (dist, c10d):
            setattr(module, name, replacement)
    for name in ("TCPStore", "FileStore"):
        ORIGINALS[name] = getattr(dist, name)
        replacement = _student_store(ORIGINALS[name])
        for module in (dist, c10d):
            if getattr(module, name, None) is ORIGINALS[name]:
                setattr(module, name, replacement)
    # torch's first init_process_group in a process sets up what later ones reuse (~0.5 ms of each rank's
    # CPU): done once here, on the grader's backend with no channel behind it (it moves no data), and undone.
    # Only a saving: where it fails, each rank pays it again.
    try:
        ORIGINALS["init_process_group"](backend=backend.NAME, store=dist.HashStore(), rank=0, world_size=1,
                                         timeout=timedelta(seconds=60))
    except Exception:  # noqa: BLE001
        pass
    if dist.is_initialized():
        ORIGINALS["destroy_process_group"]()
