"""A run's op card (harness.op_card): what `show`, `compare`, `report` and the dashboard need of
the op, read from the manifest instead of importing every kernel."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import op_card, store

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "runs"
H200 = "20261122T021915Z-softmax-6059"  # real H200 run, ncu + nsys
CPU = "20261122T023001Z-softmax-7840"  # real CPU run


def with_card(tmp_path: Path, run_id: str = H200, name: str | None = None) -> Path:
    from harness.registry import get_op

    run = tmp_path / (name or run_id)
    shutil.copytree(FIXTURES / run_id, run)
    m = store.load_manifest(run)
    store.write_manifest(run, {**m, "run_id": run.name,
                               op_card.KEY: op_card.card(get_op(m["experiment"]["op"]))})
    return run


def test_the_card_lists_the_primary_metric_backends_and_tuner_prefixes():
    from harness.registry import get_op

    c = op_card.card(get_op("attention"))
    assert c["primary"] == "tflops"
    flash = c["impls"]["triton_flash"]
    assert flash["backend"] == "triton"
    assert flash["tuners"]["attention.flash_bwd.dq"] == "dq"
    assert c["impls"]["sdpa_cudnn"]["backend"] == "library"
    json.dumps(c)  # it goes into the manifest


def test_a_tuner_under_two_prefixes_keeps_the_first():
    from types import SimpleNamespace as NS

    t = NS(name="shared.tuner")
    op = NS(primary="gbps", impls={"x": NS(backend="triton",
                                          all_tuners=lambda: {"a": t, "b": t})})
    assert op_card.card(op)["impls"]["x"]["tuners"] == {"shared.tuner": "a"}


def test_readers_take_the_card_and_fall_back_to_the_registry(monkeypatch):
    from harness.present.show import config_cells

    m = {"experiment": {"op": "softmax"}, op_card.KEY: {
        "primary": "tflops",
        "impls": {"mine": {"backend": "library", "tuners": {"t.one": "a", "t.two": "b"}}}}}
    assert op_card.primary(m) == "tflops"  # not the registry's softmax (gbps)
    assert op_card.backend(m, "softmax", "mine") == "library"
    assert op_card.backend(m, "softmax", "mine[BLOCK=4]", base_impl="mine") == "library"
    rows = [{"op": "softmax", "impl": "mine", "config": json.dumps(c)} for c in (
        {"t.one": {"BLOCK": 1}, "t.two": {"BLOCK": 2}},
        {"t.one": {"BLOCK": 4}, "t.two": {"BLOCK": 2}})]
    header, cells = config_cells(rows, m)
    assert (header, cells) == ("config a.BLOCK", ["1", "4"])  # the card's prefix, `a`
    # no card (a run from before it): the registry, as before
    assert op_card.primary({"experiment": {"op": "softmax"}}) == "gbps"
    assert op_card.backend({}, "softmax", "torch") == "torch"
    assert op_card.primary({"experiment": {"op": "no_such_op"}}) == "gbps"
    assert op_card.tuners({}, "no_such_op", "x") is None


SHOW_WITHOUT_KERNELS = """
import sys
from harness import cli
assert cli.main(sys.argv[1:]) == 0
loaded = sorted(m for m in ("torch", "triton", "kernels") if m in sys.modules)
print("LOADED", loaded)
"""


@pytest.mark.parametrize("argv", [["show", "{run}"], ["compare", "{base}", "{run}"],
                                  ["report", "{run}", "--no-png", "--out", "{out}"]])
def test_reading_a_run_with_a_card_imports_no_kernel(tmp_path, argv):
    """3-5 s of a `show` on a 2-core machine was importing torch, Triton and every op."""
    run = with_card(tmp_path)
    base = with_card(tmp_path / "b")
    args = [a.format(run=run, base=base, out=tmp_path / "rep") for a in argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    p = subprocess.run([sys.executable, "-c", SHOW_WITHOUT_KERNELS, *args], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "LOADED []" in p.stdout
    if argv[0] == "show":
        assert "triton" in p.stdout and "8192" in p.stdout
