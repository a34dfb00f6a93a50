"""`python -m grader ...`: see cli.py."""
import os
import sys

# numpy's OpenBLAS starts a thread pool in every process that imports it (the supervisor, batch workers, the
# zygote): ~0.1 s of CPU each, taken from the ranks beside it, for the small arrays the grader never hands to
# BLAS. One thread unless the caller chose otherwise (ranks get the zygote's OpenBLAS, set up at its import).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

if len(sys.argv) > 1 and sys.argv[1] in ("grade", "check", "batch"):
    from .processes import launch   # the zygote's torch import runs beside the imports below
    if sys.argv[1] == "batch":
        launch.start_template()     # its workers' zygotes are forks of this one
    else:
        launch.prestart()

from .cli import main  # noqa: E402

sys.exit(main())
