"""`python -m harness new-op NAME [--dir DIR]`: a working op to start from.

Written files (nothing is overwritten; any problem is one line, exit 2, nothing written):

    in this repository (default)        --dir DIR (a $HARNESS_OPS module, anywhere)
    kernels/NAME/__init__.py            DIR/NAME.py      the Op (params, inputs, reference,
                                                         flops, bytes), a torch impl and an
                                                         @triton.autotune Triton kernel + impl
    experiments/NAME.yaml               DIR/NAME.yaml    torch vs triton, a sweep, a smoke sweep
    tests/kernels/test_NAME.py          DIR/test_NAME.py every impl and every autotune config vs
                                                         the reference (interpreter without GPU)

The op computes y = silu(a) * b over N elements (SwiGLU's elementwise half): the pattern to
replace with the user's own math. `python -m harness run` on the YAML passes on a CPU at once.
"""
from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from string import Template

from rich.console import Console

from harness.errors import HarnessError

HELP = "write a working op to start from: Op, torch + Triton impls, experiment YAML, test"
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
ROOT = Path(__file__).resolve().parents[2]

OP_MODULE = Template('''\
"""Op `$name` (written by `python -m harness new-op $name`): a working starting point.

It computes y = silu(a) * b over two tensors of N elements (SwiGLU's elementwise half). Replace
the math in `reference`, `${name}_torch` and `_${name}_kernel` with your op's, and the counts
in `flops` and `nbytes`; keep the functions' shapes. The Triton kernel chooses its launch
config with @triton.autotune: its configs are the `triton` impl's tunables (`python -m harness
list`), which an experiment forces with `variants:` (one candidate per config).
"""
import torch
import triton
import triton.language as tl

from harness.registry import Op, Param

op = Op(
    "$name",
    params=[Param("N", int, help="elements", size=True)],
    dtypes=("float16", "bfloat16", "float32"),
    primary="gbps",
    description="y = silu(a) * b over N elements (new-op starting point)",
)


@op.inputs
def make_inputs(p, dtype, device, gen):
    a = torch.randn(p.N, device=device, dtype=torch.float32, generator=gen).to(dtype)
    b = torch.randn(p.N, device=device, dtype=torch.float32, generator=gen).to(dtype)
    return a, b


@op.reference
def reference(a, b):
    return torch.nn.functional.silu(a) * b


@op.flops
def flops(p):
    return 5.0 * p.N  # per element: exp, add, divide, two multiplies


@op.bytes
def nbytes(p, itemsize):
    return 3.0 * p.N * itemsize  # read a and b, write y


@op.output
def output(inputs, p):
    return torch.empty_like(inputs[0])


@op.impl("torch", backend="torch")
def ${name}_torch(a, b):
    """eager torch: silu, then the product"""
    return torch.nn.functional.silu(a) * b


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": bs}, num_warps=w) for bs in (1024, 4096) for w in (4, 8)],
    key=["n_elements"],
)
@triton.jit
def _${name}_kernel(a_ptr, b_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    # read 2 x BLOCK_SIZE elements
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    y = a * tl.sigmoid(a) * b
    # write BLOCK_SIZE elements
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@op.impl("triton", backend="triton", accepts_out=True, expected_kernels=1)
def ${name}_triton(a, b, out=None):
    """Triton: one BLOCK_SIZE slice per program, BLOCK_SIZE and num_warps autotuned"""
    out = torch.empty_like(a) if out is None else out
    n = a.numel()
    _${name}_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](a, b, out, n)
    return out
''')

EXPERIMENT = Template('''\
# Written by `python -m harness new-op $name`.  Run: $run
name: $name
op: $name
baseline: torch
candidates: [triton]
# one candidate per forced @triton.autotune config (`python -m harness list` shows the tunables):
# variants: {triton: {BLOCK_SIZE: [1024, 4096], num_warps: [4]}}
sweep: {N: [1048576, 16777216]}
dtypes: [float16, float32]
smoke: {N: [1000, 4099], dtypes: [float32]}   # without a GPU: the Triton interpreter
''')

TEST = Template('''\
"""Op `$name`: every implementation, and every @triton.autotune config of its Triton kernel,
against the reference on awkward sizes (without a GPU: in the Triton interpreter)."""
import os

import pytest
import torch

if not torch.cuda.is_available():  # no GPU: Triton kernels run in its CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from harness.execute.correctness import check_impl  # noqa: E402
$import_op

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the kernel's autotune configs as the harness forces them (`variants:`, `config:`)
CONFIGS = [k.as_dict(c) for k in OP.get_impl("triton").all_tuners().values()
           for c in getattr(k, "configs", ())]


@pytest.mark.parametrize("impl", sorted(OP.impls))
@pytest.mark.parametrize("n", [1, 1000, 4099])
def test_matches_reference(impl, n):
    res = check_impl(OP, impl, {"N": n}, "float32", DEVICE)
    assert res.correct, res.error


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_every_autotune_config(config):
    res = check_impl(OP, "triton", {"N": 4099}, "float16", DEVICE, config=config, trials=1)
    assert res.correct, res.error


def test_counts():
    from harness.registry import Params

    assert OP.byte_count(Params(N=10), 2) == 60 and OP.flop_count(Params(N=10)) == 50
''')


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="the op's name: a lower-case Python identifier (e.g. swiglu)")
    p.add_argument("--dir", default=None,
                   help="write a $HARNESS_OPS module DIR/NAME.py with DIR/NAME.yaml and "
                        "DIR/test_NAME.py (default: kernels/NAME/ in this repository)")


def plan(name: str, folder: str | None) -> dict[Path, str]:
    """{path: text} of the files to write; HarnessError (one line) when it cannot."""
    if not NAME_RE.match(name):
        raise HarnessError(f"new-op: {name!r} is not a lower-case Python identifier (letters, "
                           "digits, _; starting with a letter), e.g. swiglu")
    from harness.registry import registry

    if name in registry().ops:
        raise HarnessError(f"new-op: op {name!r} is already registered (by "
                           f"{registry().origin.get(name, '?')}); choose another name")
    if folder is None:
        if not (ROOT / "kernels").is_dir() or not (ROOT / "experiments").is_dir():
            raise HarnessError(f"new-op: no kernels/ and experiments/ beside harness/ in {ROOT} "
                               "(an installed copy); give --dir DIR for a $HARNESS_OPS module")
        module = ROOT / "kernels" / name / "__init__.py"
        files = {module: OP_MODULE.substitute(name=name),
                 ROOT / "experiments" / f"{name}.yaml": EXPERIMENT.substitute(
                     name=name, run=f"python -m harness run experiments/{name}.yaml"),
                 ROOT / "tests" / "kernels" / f"test_{name}.py": TEST.substitute(
                     name=name, import_op=f"from kernels.{name} import op as OP  # noqa: E402")}
    else:
        base = Path(folder).expanduser().resolve()
        if base.exists() and not base.is_dir():
            raise HarnessError(f"new-op: --dir {folder}: not a directory")
        files = {base / f"{name}.py": OP_MODULE.substitute(name=name),
                 base / f"{name}.yaml": EXPERIMENT.substitute(
                     name=name, run=f"HARNESS_OPS={base / name}.py python -m harness run "
                                    f"{base / name}.yaml"),
                 base / f"test_{name}.py": TEST.substitute(
                     name=name, import_op=f"from {name} import op as OP  # noqa: E402")}
    there = [p for p in files if p.exists() or (p.name == "__init__.py" and p.parent.exists())]
    if there:
        raise HarnessError(f"new-op: {_show(there[0] if there[0].exists() else there[0].parent)}"
                           " already exists; nothing written")
    if folder is not None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            raise HarnessError(f"new-op: a module named {name!r} already exists "
                               f"({spec.origin or 'importable'}); as a $HARNESS_OPS module "
                               "it would clash: choose another name")
    return files


def _show(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def main(a, console: Console) -> int:
    files = plan(a.name, a.dir)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    paths = [_show(p) for p in files]
    console.print(f"wrote {', '.join(paths)}", soft_wrap=True, markup=False)
    lines = []
    if a.dir is not None:
        lines.append(f"export HARNESS_OPS={next(iter(files))}")
    lines += [f"python -m pytest -q {paths[2]}", f"python -m harness run {paths[1]}"]
    console.print("next:\n  " + "\n  ".join(lines), soft_wrap=True, markup=False)
    return 0
