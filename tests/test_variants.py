"""Variants and named configs: YAML -> candidates -> cases with safe ids, one-line errors,
`--cases` with variant names, and forced configs reaching the kernel in the interpreter."""
import json
import textwrap
from pathlib import Path

import pytest
import torch

from harness import tuning

from harness.experiment import spec
from harness.errors import SpecError
from harness.registry import Params, registry

ROOT = Path(__file__).resolve().parent.parent

BASE = """
name: v
op: attention
baseline: triton_flash
sweep: {B: [1], H: [1], N: [40], D: [16], causal: [false, true]}
"""


def load(tmp_path, text):
    p = tmp_path / "e.yaml"
    p.write_text(text)
    return spec.load(p)


def test_variants_expand_to_one_candidate_per_combination_in_the_order_given(tmp_path):
    exp = load(tmp_path, BASE + textwrap.dedent("""
        candidates:
          - sdpa_cudnn
          - {name: fa_m64, impl: triton_flash, config: {BLOCK_M: 64, BLOCK_N: 32}}
        variants: {triton_flash: {num_stages: [2, 3], BLOCK_M: [64, 128]}}
        """))
    assert exp.impl_names() == [
        "triton_flash", "sdpa_cudnn", "fa_m64",
        "triton_flash[num_stages=2,BLOCK_M=64]", "triton_flash[num_stages=2,BLOCK_M=128]",
        "triton_flash[num_stages=3,BLOCK_M=64]", "triton_flash[num_stages=3,BLOCK_M=128]"]
    cases = spec.expand(exp)
    assert len(cases) == 2 * 7
    v = [c for c in cases if c.impl == "triton_flash[num_stages=3,BLOCK_M=128]"][0]
    assert v.registered_impl == "triton_flash" and v.role == "candidate"
    assert dict(v.config) == {"num_stages": 3, "BLOCK_M": 128}
    assert v.case_id == ("triton_flash~num_stages=3~BLOCK_M=128."
                         "B=1.H=1.N=40.D=16.causal=false.mode=fwd.float16")
    named = [c for c in cases if c.impl == "fa_m64"][0]
    assert named.registered_impl == "triton_flash" and named.case_id.startswith("fa_m64.B=1")
    for c in cases:  # NVTX range names, worker --cases lists, the importer's id parser
        impl_part = c.case_id[:-len(c.shape_id) - 1]
        assert not set(c.case_id) & set("/@,:[]+* ") and "." not in impl_part
    assert len({c.case_id for c in cases}) == len(cases)


def test_prefixed_tunables_of_a_second_tuner_get_safe_ids(tmp_path):
    exp = load(tmp_path, BASE + "variants: {triton_flash: {dq.BLOCK_M: [64], dq.BLOCK_N: [32]}}\n")
    c = spec.expand(exp)[-1]
    assert c.impl == "triton_flash[dq.BLOCK_M=64,dq.BLOCK_N=32]"
    assert c.case_id.startswith("triton_flash~dq-BLOCK_M=64~dq-BLOCK_N=32.B=1.")
    assert registry().get_op("attention").get_impl("triton_flash").split_config(
        dict(c.config)) == {"attention.flash_bwd.dq": {"BLOCK_M": 64, "BLOCK_N": 32}}


def test_cases_filter_takes_variant_names_as_typed(tmp_path):
    exp = load(tmp_path, BASE + "variants: {triton_flash: {BLOCK_M: [64, 128], num_stages: [2]}}\n")
    cases = spec.expand(exp)
    pick = spec.select(cases, "triton_flash[BLOCK_M=64,num_stages=2],nothing-else")
    assert {c.impl for c in pick} == {"triton_flash[BLOCK_M=64,num_stages=2]"} and len(pick) == 2
    assert len(spec.select(cases, "triton_flash~BLOCK_M=128*causal=true*")) == 1
    assert spec.glob_matches(pick[0].case_id, f"{pick[0].impl}.{pick[0].shape_id}",
                             "triton_flash[BLOCK_M=64,num_stages=2].*")


@pytest.mark.parametrize("extra, expected", [
    ("variants: {triton_flash: {BLOCK_Q: [64]}}",
     ["variants.triton_flash.BLOCK_Q", "unknown tunable", "BLOCK_M, BLOCK_N", "dq.BLOCK_M"]),
    ("variants: {triton_flash: {BLOCK_M: [64, 96]}}",
     ["variants.triton_flash.BLOCK_M[1]", "96", "valid: 16, 32, 64, 128"]),
    ("variants: {triton_flash: {BLOCK_M: [32], BLOCK_N: [64]}}",
     ["variants.triton_flash", "BLOCK_M=32, BLOCK_N=64", "BLOCK_M % BLOCK_N == 0"]),
    ("variants: {triton_flash: {dkdv.BLOCK_M: [64], dkdv.BLOCK_N: [32]}}",
     ["dkdv.BLOCK_M=64, dkdv.BLOCK_N=32", "BLOCK_N % BLOCK_M == 0"]),
    ("variants: {naive: {BLOCK_M: [32]}}",
     ["variants.naive", "no tunables", "fused_mha, triton_flash"]),
    ("variants: {flash: {BLOCK_M: [32]}}",
     ["variants.flash", "not an implementation", "registered:", "triton_flash"]),
    ("variants: {triton_flash: {BLOCK_M: []}}", ["variants.triton_flash.BLOCK_M", "empty"]),
    ("candidates: [{name: fa, impl: triton_flash, config: {BLOCK_M: 64}, extra: 1}]",
     ["unknown key 'extra'", "candidates[0]", "name, impl, config"]),
    ("candidates: [{impl: triton_flash, config: {BLOCK_M: 64}}]",
     ["candidates[0].name", "required"]),
    ("candidates: [{name: 'f[a]', impl: triton_flash, config: {BLOCK_M: 64}}]",
     ["candidates[0].name", "pattern"]),
    ("candidates: [{name: fa, impl: triton_flash, config: {num_stages: 9}}]",
     ["candidates[0].config.num_stages", "valid: 1, 2, 3, 4, 5"]),
    ("candidates: [{name: naive, impl: triton_flash, config: {BLOCK_M: 64}}]",
     ["candidates[0].name", "registered implementation"]),
    ("candidates: [{name: fa, impl: triton_flash, config: {BLOCK_M: 64}},"
     " {name: fa, impl: triton_flash, config: {BLOCK_M: 32}}]",
     ["candidates[1]", "'fa' is given twice"]),
])
def test_bad_variants_are_one_line_errors_naming_field_and_choices(tmp_path, extra, expected):
    with pytest.raises(SpecError) as exc:
        load(tmp_path, BASE + extra + "\n")
    msg = str(exc.value)
    assert "\n" not in msg
    for part in expected:
        assert part in msg, (part, msg)


def test_every_triton_impl_exposes_tunables_with_valid_values():
    reg = registry()
    seen = 0
    for op in reg.ops.values():
        for impl in op.impls.values():
            if impl.backend != "triton":
                continue
            tunables = impl.tunables()
            assert tunables, (op.name, impl.name)
            for name, (tuner, f) in tunables.items():
                assert tuner.valid_values(f), (op.name, impl.name, name)
            seen += 1
    assert seen >= 10


class _Recorder:
    """Stands in for a jit kernel: records the launch keyword arguments, then launches."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append(kw)
            return self.kernel[grid](*args, **kw)

        return launch


def test_a_forced_config_reaches_the_flash_kernel_in_the_interpreter(monkeypatch):
    from kernels.attention import flash_fwd

    rec = _Recorder(flash_fwd._flash_fwd_kernel)
    monkeypatch.setattr(flash_fwd, "_flash_fwd_kernel", rec)
    op = registry().get_op("attention")
    impl = op.get_impl("triton_flash")
    p = Params(B=1, H=2, N=70, D=16, causal=True, mode="fwd")
    gen = torch.Generator().manual_seed(0)
    inputs = op.make_inputs(p, torch.float16, "cpu", gen)
    with tuning.forcing(impl.split_config({"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 2})), \
            tuning.recording() as log:
        out = op.bind_impl(impl, inputs, p)()
    assert rec.calls[-1]["BLOCK_M"] == 64 and rec.calls[-1]["BLOCK_N"] == 32
    assert rec.calls[-1]["num_stages"] == 2
    assert log.configs()["attention.flash_fwd"]["BLOCK_M"] == 64 and log.source() == "forced"
    ref = op.run_reference(tuple(t.float() for t in inputs), p)
    assert torch.allclose(out.float(), ref, atol=2e-2)
    op.bind_impl(impl, inputs, p)()  # unforced: the interpreter's own small config
    assert rec.calls[-1]["BLOCK_M"] == flash_fwd.INTERPRETER_CONFIG[0]


def test_cases_table_records_the_candidate_and_the_impl_it_runs(tmp_path):
    from harness.store.results import cases_frame

    exp = load(tmp_path, BASE + "variants: {triton_flash: {BLOCK_M: [64]}}\n")
    df = cases_frame(spec.expand(exp))
    row = df[df.impl == "triton_flash[BLOCK_M=64]"].iloc[0]
    assert row.base_impl == "triton_flash" and json.loads(row.forced_config) == {"BLOCK_M": 64}
    plain = df[df.impl == "triton_flash"].iloc[0]
    assert plain.base_impl == "triton_flash" and not isinstance(plain.forced_config, str)


def test_show_prints_the_config_compactly_only_where_it_varies():
    from harness.present.show import config_cells

    def row(impl, cfg, source="forced"):
        return {"op": "attention", "base_impl": "triton_flash", "impl": impl,
                "config": json.dumps(cfg) if cfg else None, "config_source": source}

    fwd = "attention.flash_fwd"
    rows = [row("triton_flash", {fwd: {"BLOCK_M": 128, "BLOCK_N": 64}}, "tuned"),
            row("triton_flash[BLOCK_M=64]", {fwd: {"BLOCK_M": 64, "BLOCK_N": 64}}),
            {"op": "attention", "impl": "sdpa_cudnn", "config": None}]
    assert config_cells(rows) == ("config BLOCK_M", ["128", "64 (forced)", "-"])
    assert config_cells(rows[:1] + rows[2:]) is None  # one config: nothing varies
    dq = "attention.flash_bwd.dq"
    both = [row("a", {fwd: {"BLOCK_M": 128}, dq: {"BLOCK_M": 64}}),
            row("b", {fwd: {"BLOCK_M": 128}, dq: {"BLOCK_M": 32}})]
    assert config_cells(both) == ("config dq.BLOCK_M", ["64 (forced)", "32 (forced)"])
    # a tuner picked twice in one case (the MLP's two GEMMs): an identical repeat is left out,
    # a different one shows only the fields that differ
    mm = "matmul_tma"
    first = {"BLOCK_M": 128, "BLOCK_N": 256}
    twice = [row("up_down_same", {mm: first, mm + "#2": dict(first)}, "tuned"),
             row("up_down_differ", {mm: first, mm + "#2": {**first, "BLOCK_N": 128}}, "tuned"),
             row("other", {mm: {"BLOCK_M": 64, "BLOCK_N": 256}}, "tuned")]
    assert config_cells(twice) == (
        "config", ["matmul_tma.BLOCK_M=128", "matmul_tma.BLOCK_M=128 matmul_tma#2.BLOCK_N=128",
                   "matmul_tma.BLOCK_M=64"])
    from harness.present.show import compact_keys

    assert compact_keys(["dkdv.BLOCK_M", "dkdv.BLOCK_N", "dq.BLOCK_M", "BLOCK_N"]) == \
        "dkdv.BLOCK_M/BLOCK_N/dq.BLOCK_M/BLOCK_N"


def test_show_of_a_one_shape_grid_has_no_case_column(tmp_path):
    """A config grid has one shape: "every case: ..." names it, and the table keeps its width
    for the variant names and their configs (the case id was repeated per row before)."""
    import io

    from rich.console import Console

    from harness import cli

    from harness.present import show

    out = tmp_path / "runs"
    assert cli.main(["run", str(ROOT / "experiments/tune/flash_bwd_dq_grid.yaml"), "--smoke",
                     "--device", "cpu", "--out", str(out), "--cases",
                     "*dq-BLOCK_N=32~dq-num_warps=4~dq-num_stages=2*"]) == 0
    run = next(out.iterdir())
    buf = io.StringIO()
    show.render(run, Console(file=buf, width=230, highlight=False))
    text = buf.getvalue()
    assert "every case: B=1 H=1 N=80 D=16 causal=false mode=bwd" in text
    header = next(line for line in text.splitlines() if "median ms" in line)
    assert "case" not in header.replace("every case", "")
    assert ("triton_flash[dq.BLOCK_M=64,dq.BLOCK_N=32,dq.num_warps=4,dq.num_stages=2,dq.TMA=0]"
            in text)


def test_variant_names_survive_parquet_the_report_and_the_dashboard_table(tmp_path):
    from dashboard import data
    from harness import store
    from harness.present import report_context
    from harness.analysis.summary import summary_frame
    from harness.store.results import cases_frame

    exp = load(tmp_path, BASE + "variants: {triton_flash: {BLOCK_M: [64, 128]}}\n")
    cases = cases_frame(spec.expand(exp))
    run = store.create_run(tmp_path / "runs", "v", {"experiment": exp.model_dump(mode="json"),
                                                    "device": "cuda"})
    store.write_table(run, "cases", cases.assign(status="ok"))
    configs = [json.dumps({"attention.flash_fwd": {"BLOCK_M": 64 if "64" in i else 128}})
               for i in cases.impl]
    store.write_table(run, "results", cases[["case_id"]].assign(
        median_ms=1.0, config=configs, config_source="forced", code_hash="0123456789ab"))
    df = summary_frame(run)
    assert "triton_flash[BLOCK_M=128]" in set(df.impl)
    table = data.summary_table(df, cpu=False)
    assert list(table["config BLOCK_M"][:3]) == ["128 (forced)", "64 (forced)", "128 (forced)"]
    md = report_context.cases_table(df, cpu=False, primary="tflops", baseline="triton_flash")
    assert md["columns"][-1] == "config BLOCK_M"
    assert any(r[1] == "`triton_flash[BLOCK_M=64]`" for r in md["rows"])
