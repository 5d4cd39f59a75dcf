"""`harness doctor`: what this machine can do, and how to fix what it cannot.

GPU and driver, torch/CUDA, the Triton backend (GPU or interpreter), nvtx, NVML, ncu (path, version,
counter permission: ERR_NVGPUCTRPERM with NVIDIA's fix), nsys (path, version, whether its
QdstrmImporter can load), the roofline calibration, and the store. CUDA is only touched in
subprocesses. Exit code 1 when a check that a GPU run needs fails on a GPU machine.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
from pathlib import Path

from harness.store.option import add_store_argument

HELP = "check the GPU, driver, Triton backend, ncu/nsys (and counter permission), nvtx"

PROBE_CUDA = ("import torch, triton\n"
              "print(torch.cuda.get_device_name(0), '| triton target:',"
              " triton.runtime.driver.active.get_current_target())")
PROBE_INTERP = ("import torch, triton, triton.language as tl\n"
                "@triton.jit\n"
                "def k(x, y, n, B: tl.constexpr):\n"
                "    o = tl.arange(0, B)\n"
                "    tl.store(y + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)\n"
                "x = torch.arange(8.0); y = torch.empty_like(x); k[(1,)](x, y, 8, B=8)\n"
                "assert torch.equal(y, 2 * x); print('interpreter ran a kernel')")
PROBE_NCU = "import torch; (torch.ones(4, device='cuda') + 1).sum().item()"
IMPORTER_LIB_FIX = ("nsys's QdstrmImporter cannot load its libraries: put libdw.so.1 and "
                    "libelf.so.1 (Debian: libdw1, libelf1) on LD_LIBRARY_PATH, or nsys will "
                    "leave only a .qdstrm")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_argument(p, out_alias=True, help="store root to check (default: runs/)")
    p.add_argument("--no-ncu-probe", action="store_true",
                   help="skip profiling a tiny kernel to test counter permission")


def _py(code: str, env: dict | None = None, timeout: float = 180) -> tuple[int, str]:
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=timeout, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:g} s"
    out = (p.stdout + p.stderr).strip().splitlines()
    return p.returncode, (out[-1] if out else "")


def checks(out_root: str, probe_ncu: bool = True) -> list[tuple[str, bool | None, str]]:
    """(name, ok, detail) rows; ok None = not applicable here."""
    import torch

    from harness.machine import env as envmod
    from harness import store
    from harness.profilers.ncu import PERM_ERROR, PERM_FIX, Ncu, find_ncu
    from harness.profilers.nsys import Nsys, find_nsys

    rows: list[tuple[str, bool | None, str]] = []
    gpus = envmod.query_gpus()
    has_gpu = bool(gpus) and torch.version.cuda is not None
    rows.append(("python", True, sys.version.split()[0] + f" ({sys.executable})"))
    rows.append(("torch", True, f"{torch.__version__} (CUDA build: {torch.version.cuda or 'no'})"))
    if gpus:
        g = gpus[0]
        rows.append(("GPU", True, f"{g.get('gpu_name')} x{len(gpus)}, driver {g.get('driver')}, "
                                  f"SM clock {g.get('sm_clock_mhz')} / max "
                                  f"{g.get('sm_clock_max_mhz')} MHz"))
    else:
        rows.append(("GPU", None, "none (nvidia-smi found no NVIDIA GPU): runs use the CPU and "
                                  "the Triton interpreter"))
    if has_gpu:
        rc, out = _py(PROBE_CUDA)
        rows.append(("CUDA + Triton", rc == 0, out))
    else:
        rc, out = _py(PROBE_INTERP, {"TRITON_INTERPRET": "1"})
        rows.append(("Triton interpreter", rc == 0, out))
    try:
        import nvtx  # noqa: F401

        rows.append(("nvtx", True, f"importable ({getattr(nvtx, '__file__', '')})"))
    except ImportError as exc:
        rows.append(("nvtx", False, f"{exc}: pip install nvtx"))
    rows.append(_nvml_check(gpus))
    a = Ncu().availability()
    rows.append(("ncu", a.ok if has_gpu else (a.ok or None), a.detail))
    if a.ok and has_gpu and probe_ncu:
        exe, _ = find_ncu()
        try:
            p = subprocess.run([exe, "--clock-control", "none", "--metrics",
                                "gpu__time_duration.sum", "--csv", sys.executable, "-c",
                                PROBE_NCU], capture_output=True, text=True, timeout=300)
            text = p.stdout + p.stderr
            if PERM_ERROR in text:
                rows.append(("GPU counters", False, f"{PERM_ERROR}: {PERM_FIX}"))
            else:
                ok = p.returncode == 0 and "gpu__time_duration.sum" in text
                rows.append(("GPU counters", ok, "ncu profiled a kernel" if ok else
                             f"ncu exited {p.returncode}: {text.strip().splitlines()[-1:]}"))
        except subprocess.TimeoutExpired:
            rows.append(("GPU counters", False, "ncu probe timed out"))
    n = Nsys().availability()
    rows.append(("nsys", n.ok if has_gpu else (n.ok or None),
                 n.detail + ("" if n.ok else "; the kernel table falls back to torch.profiler")))
    exe, _ = find_nsys()
    if n.ok and exe:
        rows.append(_importer_check(exe))
    cal = store.load_calibration(gpus[0].get("gpu_name") if gpus else None, out_root)
    if has_gpu:
        rows.append(("calibration", True if cal is not None else None,
                     f"cached for {cal.get('gpu_name')} ({cal.get('measured_utc')})" if cal else
                     "not measured yet: `python -m harness calibrate` (a GPU run does it once)"))
    root = Path(out_root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".doctor-write-test"
        probe.write_text("ok")
        probe.unlink()
        rows.append(("store", True, f"{root.resolve()} is writable"))
    except OSError as exc:
        rows.append(("store", False, f"{root}: {exc}"))
    return rows


def _nvml_check(gpus: list) -> tuple[str, bool | None, str]:
    """NVML through nvidia-ml-py: the SM clock and temperature of every case in-process
    (nvidia-smi per case without it: slower, not wrong, so never a failure)."""
    from harness.machine import nvml

    try:
        import pynvml
    except ImportError:
        return ("NVML", None, "nvidia-ml-py not installed: GPU state read by nvidia-smi per case "
                              "(pip install nvidia-ml-py)")
    if not gpus:
        return ("NVML", None, f"nvidia-ml-py importable ({pynvml.__name__}); no GPU to read")
    state = nvml.gpu_state(0)
    if state is None:
        return ("NVML", None, "nvidia-ml-py cannot read GPU 0 (driver library?): nvidia-smi per "
                              "case instead")
    return ("NVML", True, f"{state['gpu_name']}: SM clock {state['sm_clock_mhz']:.0f} MHz, "
                          f"{state['gpu_temp_c']:.0f} C")


def _importer_check(nsys_exe: str) -> tuple[str, bool, str]:
    """nsys converts its .qdstrm with QdstrmImporter, which must be able to load libdw/libelf."""
    base = Path(nsys_exe).resolve().parent.parent
    hits = (glob.glob(str(base / "*" / "QdstrmImporter")) +
            glob.glob(str(base.parent / "host" / "*" / "QdstrmImporter")))
    if not hits:
        return ("nsys importer", True, "no separate QdstrmImporter (standalone nsys install)")
    try:
        p = subprocess.run([hits[0], "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ("nsys importer", False, f"{hits[0]}: {exc}")
    text = p.stdout + p.stderr
    if "error while loading shared libraries" in text:
        return ("nsys importer", False, f"{IMPORTER_LIB_FIX} ({text.strip().splitlines()[0]})")
    return ("nsys importer", True, f"{hits[0]} loads")


def main(a, console) -> int:
    rows = checks(a.store, probe_ncu=not a.no_ncu_probe)
    mark = {True: "[green]ok[/]  ", False: "[red]FAIL[/]", None: "[dim]n/a[/] "}
    for name, ok, detail in rows:
        console.print(f"{mark[ok]} {name:<18} {detail}", soft_wrap=True)
    failed = [n for n, ok, _ in rows if ok is False]
    if failed:
        console.print(f"[red]{len(failed)} check(s) failed:[/] {', '.join(failed)}")
    return 1 if failed else 0
