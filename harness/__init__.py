"""kernel-lab: the profile -> change -> measure loop for GPU kernels.

Pipeline: experiment YAML (`spec`) -> ops and implementations (`registry`, `kernels/*`) ->
worker passes (`correctness`, `timing`, `profilers`) -> `store` -> `report` / dashboard.
"""

__version__ = "0.1.0"
