"""kernel-lab: the profile -> change -> measure loop for GPU kernels.

Pipeline, one package per stage (docs/design.md): experiment YAML (`experiment`) -> ops and
implementations (`registry`, `kernels/*`) -> worker passes (`execute`: correctness, timing,
profiler passes; `profilers`) -> `store` -> `analysis` -> `present` (show, report) / dashboard.

Modules that lived directly in harness/ before the stage packages still import under their old
names (`from harness.correctness import check_impl` in a test that `new-op` wrote, `import
harness.timing`): the name is the moved module itself, imported on first use.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

# old name -> where it lives now
MOVED = {
    "harness.spec": "harness.experiment.spec",
    "harness.variants": "harness.experiment.variants",
    "harness.newop": "harness.experiment.newop",
    "harness.runner": "harness.execute.runner",
    "harness.worker": "harness.execute.worker",
    "harness.correctness": "harness.execute.correctness",
    "harness.timing": "harness.execute.timing",
    "harness.previous": "harness.execute.previous",
    "harness.profiler_passes": "harness.execute.profiler_passes",
    "harness.pycache": "harness.execute.pycache",
    "harness.selfprofile": "harness.execute.selfprofile",
    "harness.calibrate": "harness.execute.calibrate",
    "harness.executors": "harness.execute.executors",
    "harness.ab": "harness.execute.ab",
    "harness.ab_worker": "harness.execute.ab_worker",
    "harness.interleave": "harness.execute.interleave",
    "harness.code_tree": "harness.execute.code_tree",
    "harness.autotune": "harness.tuning.autotune",
    "harness.provenance": "harness.tuning.provenance",
    "harness.results": "harness.store.results",
    "harness.store_option": "harness.store.option",
    "harness.importer": "harness.profilers.importer",
    "harness.show": "harness.present.show",
    "harness.report": "harness.present.report",
    "harness.report_budget": "harness.present.report_budget",
    "harness.report_context": "harness.present.report_context",
    "harness.report_pivot": "harness.present.report_pivot",
    "harness.charts": "harness.present.charts",
    "harness.picks": "harness.present.picks",
    "harness.ab_show": "harness.present.ab_show",
    "harness.analysis.compare_cli": "harness.present.compare_cli",
    "harness.env": "harness.machine.env",
    "harness.nvml": "harness.machine.nvml",
    "harness.doctor": "harness.machine.doctor",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name (or a module under an old package name, harness.executors.gpus) and
    hands out the moved module itself, so both names are one module object."""

    def __init__(self):
        self.own_specs: dict = {}  # old name -> the moved module's own spec, while loading

    def _target(self, name: str) -> str | None:
        for old, new in MOVED.items():
            if name == old or name.startswith(old + "."):
                return new + name[len(old):]
        return None

    def find_spec(self, name, path=None, target=None):
        new = self._target(name) if name.startswith("harness.") else None
        if new is None or importlib.util.find_spec(new) is None:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=False)

    def create_module(self, spec):
        module = importlib.import_module(self._target(spec.name))
        self.own_specs[spec.name] = module.__spec__
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module):
        # the moved module ran when it was imported under its own name; importlib has just set
        # its __spec__ to the old name's: give it back its own
        module.__spec__ = self.own_specs.pop(module.__spec__.name)


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.insert(0, _Moved())  # before an editable install's finder of another tree
