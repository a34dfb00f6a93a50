"""Grader tensor work inside a rank: no autograd, no torch-function or dispatch mode of the student's, so that
a student's mode or patched Tensor cannot intercept what the grader reads or writes. Used by the transport
(backend.py) and by the reader of the rank's answers (values.py). Everything it calls is taken at import,
in the zygote, before any student code."""
from __future__ import annotations

import torch
from torch._C import _len_torch_dispatch_stack as _dispatch_modes
from torch._ops import _len_torch_dispatch_stack_pre_dispatch as _pre_dispatch_modes
from torch.utils._python_dispatch import _disable_current_modes
# _disable_current_modes imports this on its first use: imported here, the zygote holds it and no rank
# loads it from disk (tests/test_runner.py: a rank imports nothing while it is observed and perturbed).
import torch._subclasses.schema_check_mode  # noqa: F401,E402

_no_grad = torch.no_grad


class Guard:
    """Grader tensor work: no autograd, no torch-function or dispatch mode of the student's."""

    def __enter__(self):
        # torch-function handling off first: no_grad's own _set_grad_enabled goes through a student's mode
        self._stack = [torch._C.DisableTorchFunction(), _no_grad()]
        if _dispatch_modes() or _pre_dispatch_modes():   # a mode of the student's (rare): put aside meanwhile
            self._stack.append(_disable_current_modes())
        for ctx in self._stack:
            ctx.__enter__()
        return self

    def __exit__(self, *exc):
        for ctx in reversed(self._stack):
            ctx.__exit__(None, None, None)
        return False
