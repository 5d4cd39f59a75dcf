"""Where the per-case worker runs: one local process (`local`), one process per GPU of the host
(`gpus`), or Ray tasks (`ray`). The runner hands an executor the cases of the check + time
passes, already ordered longest first, with a watchdog limit per case; records land in the
run's parts files either way, so a run directory looks the same whatever ran it.
"""
from harness.execute.executors.base import Executor  # noqa: F401
from harness.execute.executors.choose import from_manifest, make_executor  # noqa: F401
