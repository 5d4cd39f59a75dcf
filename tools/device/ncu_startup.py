"""Where an ncu profiler process's first seconds go (device, repo root, after
`source .devcarry/env.sh`):

    python3 tools/device/ncu_startup.py [REPEATS]

Runs a small script under the harness's own ncu command line (the sections flash.yaml asks for,
source lines on, the NVTX filter on the `harness` domain) and prints, per process: torch's
import, CUDA's initialisation, cuBLAS's first call, the first profiled range and two more
(one 2048^2 fp16 matmul each), and the process's wall. The first profiled range's excess
over the later ones is ncu's own set-up at its first profiled kernel.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

APP = r'''
import time
t0 = time.time()
import nvtx
import torch
t_imp = time.time()
torch.cuda.init(); x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t1 = time.time()
y = x @ x; torch.cuda.synchronize()
t2 = time.time()
def rng(name):
    nvtx.push_range(message=name, domain="harness")
    z = x @ x; torch.cuda.synchronize()
    nvtx.pop_range(domain="harness")
marks = []
for name in ("a", "b", "c"):
    rng(name); marks.append(time.time())
print("TIMES import %.2f cuda_init %.2f cublas %.2f ranges %.2f %.2f %.2f" % (
    t_imp - t0, t1 - t_imp, t2 - t1, marks[0] - t2, marks[1] - marks[0], marks[2] - marks[1]),
    flush=True)
'''
SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats",
            "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "SchedulerStats"]


def main() -> int:
    sys.path.insert(0, os.getcwd())
    from harness.profilers.ncu import Ncu

    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    d = Path(tempfile.mkdtemp())
    (d / "app.py").write_text(APP)
    opts = SimpleNamespace(sections=SECTIONS, source_lines=True, metrics=[])
    argv = Ncu().command([sys.executable, str(d / "app.py")], d, opts)
    for k in range(repeats):
        t = time.time()
        p = subprocess.run(argv, capture_output=True, text=True)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("TIMES")), "")
        print(f"ncu process {k}: wall {time.time() - t:.2f} s; {line}", flush=True)
        if p.returncode:
            print(p.stdout[-1500:], p.stderr[-1500:])
            return p.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
