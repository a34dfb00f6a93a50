"""Isolation layers for rank processes, built from what Linux gives directly (no Docker); and which of them
this machine allows (`probe`).

A run is a small process tree forked from the zygote (tree.py):

    init I (pid 1 of a new pid ns)       -- memory cgroup; unshare(net, mount, ipc, uts); loopback up;
                                            new_root(): a tmpfs holding the interpreter (read-only) and /tmp;
                                            fresh /proc, pivot_root into it; forks the ranks, hosts the
                                            run's store, reaps the ranks, reports their exits
      rank 0..N-1                        -- rlimits, a uid of its run's own, NO_NEW_PRIVS + seccomp
                                            (seccomp.py), then student code

As root, the zygote forks I straight into the new pid namespace (tree.PidNamespaces), and I is a pod
(pods.py) unless the run uses CUDA: kept for the zygote's next run once it has killed (kill(-1)) and
reaped every other process of its namespace, so two runs never share one at the same time (a pod hosts a
real-backend run's store in a child, in network and IPC namespaces it makes for that run). Without root, a
leader L above I enters a user namespace first (the pid namespace must belong to it) with the others,
builds the root, and forks I. Killing I tears the pid namespace down: every process in it dies,
double-forked daemons included.

The layers live apart, as ioi/isolate keeps them: cgroup.py (the memory cgroup), root.py (the run's
filesystem), limits.py (rlimits and uids), namespaces.py (the run's and each rank's namespaces), seccomp.py
(the system-call filter); linux.py holds the system calls they share. Each layer is optional: `probe()`
says which this machine allows, and the report lists those applied (and names seccomp and NO_NEW_PRIVS
when they are missing).
"""
from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass

from . import seccomp
from .namespaces import enter_namespaces
from .root import enter_root, new_root

@dataclass(frozen=True)
class Layers:
    root: bool                    # can drop ranks to an unprivileged uid (a new one for every run)
    namespaces: bool              # pid + net + mount + ipc + uts namespaces and a new root per run
    user_namespace: bool          # namespaces obtained through an unprivileged user namespace
    seccomp: bool = False         # the seccomp filter of seccomp.py
    no_new_privs: bool = False

    def names(self, tmp_mb: int = 0) -> list[str]:
        """Layer ids, rendered through the message catalog (`layer.<id>`); missing protections are named too."""
        out = ["rlimits", "process_group"]
        if self.root:
            out.append("uid_per_run")
        if self.namespaces:
            out += ["pid_ns", "net_ns", "ipc_ns", "new_root", f"tmpfs:{tmp_mb}", "fresh_proc"]
            if self.user_namespace:
                out.append("user_ns")
        else:
            out.append("no_namespaces")
        out.append("no_new_privs" if self.no_new_privs else "no_new_privs_off")
        out.append("seccomp" if self.seccomp else "seccomp_off")
        return out


PROBE_NS, PROBE_ROOT, PROBE_NNP, PROBE_SECCOMP = 1, 2, 4, 8


def probe(workspace: str, code: list[str]) -> Layers:
    """Build one run's sandbox in a throwaway child (and its pid 1); never changes the caller.
    `workspace`: a folder for the probe's mount point; `code`: interpreter_paths()."""
    return Probe(workspace, code).layers()


class Probe:
    """probe(), started now and read later: the zygote starts it before it imports torch, so that the probe
    runs beside the import (and forks a small process, not a torch-sized one)."""

    def __init__(self, workspace: str, code: list[str]):
        self.target = tempfile.mkdtemp(prefix="probe-", dir=workspace)
        self.read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.read)
            _probe_child(self.target, code, write)
        os.close(write)

    def layers(self) -> Layers:
        data = os.read(self.read, 16)
        os.close(self.read)
        os.waitpid(self.pid, 0)
        try:
            os.rmdir(self.target)
        except OSError:
            pass
        bits = int(data or b"0")
        root = os.geteuid() == 0
        namespaces = bool(bits & PROBE_NS and bits & PROBE_ROOT)
        return Layers(root=root, namespaces=namespaces, user_namespace=namespaces and not root,
                      seccomp=bool(bits & PROBE_SECCOMP), no_new_privs=bool(bits & PROBE_NNP))


def _probe_child(target: str, code: list[str], write: int) -> None:
    """The probe's throwaway child: which layers can be built here, as bits on `write`. Never returns."""
    bits = 0
    try:
        enter_namespaces(use_userns=os.geteuid() != 0)
        bits |= PROBE_NS
        new_root(target, 1, code)
        init = os.fork()
        if init == 0:
            got = 0
            try:
                enter_root(target)
                if os.path.isdir(sys.base_prefix) and os.listdir("/proc"):
                    got |= PROBE_ROOT
                try:
                    seccomp.install()
                    got |= PROBE_NNP | PROBE_SECCOMP
                except OSError:
                    seccomp.set_no_new_privs()
                    got |= PROBE_NNP
            except BaseException:
                pass
            os._exit(got)
        _, status = os.waitpid(init, 0)
        bits |= os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 0
    except BaseException:
        pass
    if not bits & PROBE_SECCOMP:  # no working sandbox root: can this machine still filter system calls?
        try:
            seccomp.install(deny_locks=False)
            bits |= PROBE_NNP | PROBE_SECCOMP
        except BaseException:
            try:
                seccomp.set_no_new_privs()
                bits |= PROBE_NNP
            except BaseException:
                pass
    os.write(write, str(bits).encode())
    os._exit(0)
