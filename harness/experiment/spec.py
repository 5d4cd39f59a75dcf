"""Experiment files: load, validate (pydantic + the op registry), expand into cases.

    name: softmax-rows
    op: softmax
    baseline: torch
    candidates: [torch_compile, triton]            # or {name, impl, config} (experiment.variants)
    variants: {triton: {num_warps: [4, 8]}}        # one candidate per combination of tunables
    sweep: {M: [4096, 8192], N: [1024, 8192]}     # cartesian; or `cases: [{M: 1, N: 8}, ...]`
    params: {}                                     # fixed parameters for every case
    dtypes: [float16, bfloat16]
    smoke: {M: [64], N: [100]}                     # overrides for GPU-less runs (interpreter)
    timing: {warmup_ms: 25, rep_ms: 200, flush_l2: true}
    profile: {ncu: {cases: first}, nsys: {enabled: true}}

Every error is one line naming the file, the field and the valid choices (`SpecError`).
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.errors import HarnessError, SpecError
from harness.experiment.variants import NAME_PATTERN, case_name
from harness.experiment.variants import candidates as candidate_list
from harness.experiment.variants import validate as validate_candidates

DTYPE_ALIASES = {
    "float16": "float16", "fp16": "float16", "half": "float16", "f16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float32": "float32", "fp32": "float32", "float": "float32", "f32": "float32",
}
DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}

# ncu section identifiers of Nsight Compute 2025.3.1 (`ncu --list-sections`).
NCU_SECTIONS = (
    "C2CLink", "ComputeWorkloadAnalysis", "InstructionStats", "LaunchStats",
    "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Chart", "MemoryWorkloadAnalysis_Tables",
    "NumaAffinity", "Nvlink", "Nvlink_Tables", "Nvlink_Topology", "Occupancy", "PmSampling",
    "PmSampling_WarpStates", "SchedulerStats", "SourceCounters", "SpeedOfLight",
    "SpeedOfLight_HierarchicalDoubleRooflineChart", "SpeedOfLight_HierarchicalHalfRooflineChart",
    "SpeedOfLight_HierarchicalSingleRooflineChart", "SpeedOfLight_HierarchicalTensorRooflineChart",
    "SpeedOfLight_RooflineChart", "WarpStateStats", "WorkloadDistribution",
)
# None by default: every canonical metric is asked for by name (profilers.metrics, --metrics),
# and a section adds only what the harness never reads (for the Nsight Compute UI) at a cost:
# on an H100, flash_bwd.yaml's six ncu cases took 26 replay passes per kernel and 41.9 s with
# the seven sections this list held until 2026-11-27, 23 passes and 36.5 s without them, every
# canonical value there (1248; 90 % within 0.9 %, durations median 0.2 %). Name sections in
# the YAML to keep them in the report.
DEFAULT_NCU_SECTIONS: list[str] = []

Scalar = Union[bool, int, float, str]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimingOptions(_Strict):
    """How each case is timed (see harness.execute.timing)."""

    warmup_ms: float = Field(25.0, gt=0)
    rep_ms: float = Field(200.0, gt=0, description="time budget for samples, per case")
    min_samples: int = Field(10, ge=1)
    max_samples: int = Field(5000, ge=1)
    flush_l2: bool = True
    cuda_graph: bool = False
    max_rel_err: float = Field(0.005, gt=0, lt=1, description="stop early at this rel. std. error")
    host_overhead: Literal["hide", "include"] = Field(
        "hide", description="hide: events time device work only; include: idle gaps count")
    case_timeout_s: float | None = Field(
        None, gt=0, description="watchdog per (pass, case); default max(120 s, 4x estimate)")
    compile_ahead: bool = Field(
        True, description="GPU runs: compile the Triton / torch.compile impls in a few "
        "parallel processes before the check pass (warm caches; nothing is measured there)")
    processes: int | None = Field(
        None, ge=1, le=8, description="worker processes the time pass spreads each case over "
        "(the sample budget split between them, order rotated): every case keeps its own "
        "between-process spread, the noise `compare` judges it by. Default: 2 on a GPU, 1 on "
        "the CPU, whose timings are never judged (store.time_processes); 1 gives that up "
        "(compare then falls back to the A/A floor)")


class CorrectnessOptions(_Strict):
    enabled: bool = True
    trials: int = Field(2, ge=1, le=20, description="fresh random inputs per trial")
    tol_factor: float = Field(2.0, ge=1.0, description="allowed multiple of torch's own error")


class NcuOptions(_Strict):
    enabled: bool = True
    sections: list[str] = Field(default_factory=lambda: list(DEFAULT_NCU_SECTIONS))
    metrics: list[str] = Field(default_factory=list, description="extra raw metric names")
    cases: Union[Literal["first", "all"], list[str]] = "first"
    timeout_s: float = Field(1800, gt=0)
    source_lines: Union[Literal["auto"], bool] = Field(
        "auto", description="warp-stall samples per source line (ncu's PC sampling, one more "
        "replay pass per kernel); auto = on when a profiled case is a Triton impl")

    @field_validator("sections")
    @classmethod
    def _known_sections(cls, v: list[str]) -> list[str]:
        for s in v:
            if s not in NCU_SECTIONS:
                raise ValueError(f"unknown ncu section {s!r} (valid: {', '.join(NCU_SECTIONS)})")
        return v


class NsysOptions(_Strict):
    enabled: bool = True
    timeout_s: float = Field(1800, gt=0)


class ProfileOptions(_Strict):
    ncu: NcuOptions | None = None
    nsys: NsysOptions | None = None


class NamedConfig(_Strict):
    """A candidate that runs `impl` with some of its tunables fixed (`harness list`)."""

    name: str = Field(pattern=NAME_PATTERN)
    impl: str
    config: dict[str, Scalar] = Field(default_factory=dict)


class Experiment(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    op: str
    baseline: str
    candidates: list[Union[str, NamedConfig]] = Field(default_factory=list)
    variants: dict[str, dict[str, Union[list[Scalar], Scalar]]] | None = None
    sweep: dict[str, Union[list[Scalar], Scalar]] | None = None
    cases: list[dict[str, Scalar]] | None = None
    params: dict[str, Scalar] = Field(default_factory=dict)
    dtypes: list[str] = Field(default_factory=lambda: ["float16"])
    smoke: dict[str, Union[list[Scalar], Scalar]] | None = None
    timing: TimingOptions = TimingOptions()
    correctness: CorrectnessOptions = CorrectnessOptions()
    profile: ProfileOptions = ProfileOptions()

    def impl_names(self) -> list[str]:
        """Candidate names, baseline first (variants expanded: `impl[k=v,...]`)."""
        return [c.name for c in candidate_list(self)]


@dataclass(frozen=True)
class Case:
    """One (implementation, parameter values, dtype) to check, time and profile."""

    op: str
    impl: str  # the candidate's name: a registered impl, a named config or `impl[k=v,...]`
    role: str  # "baseline" | "candidate"
    params: tuple[tuple[str, Scalar], ...]  # in the op's parameter order
    dtype: str  # canonical: float16 | bfloat16 | float32
    base_impl: str = ""  # the registered implementation it runs ("" = impl)
    config: tuple[tuple[str, Scalar], ...] = ()  # tunables the candidate fixes

    @property
    def shape_id(self) -> str:
        """Parameters + dtype, without the impl: cases sharing it are compared to each other."""
        return ".".join([f"{k}={_fmt(v)}" for k, v in self.params] + [self.dtype])

    @property
    def case_id(self) -> str:
        """Stable id, also the NVTX range name: no `/ @ , : [ ] + *` (ncu filter syntax)."""
        return f"{case_name(self.impl)}.{self.shape_id}"

    @property
    def registered_impl(self) -> str:
        return self.base_impl or self.impl

    @property
    def params_dict(self) -> dict[str, Scalar]:
        return dict(self.params)

    def label(self) -> str:
        return " ".join(f"{k}={_fmt(v)}" for k, v in self.params)


def _fmt(v: Scalar) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


# ---------------------------------------------------------------------------------------------
# loading

def load(path: str | Path, *, registry=None) -> Experiment:
    """Read, parse and validate an experiment file. Raises SpecError (one line)."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"{path}: no such experiment file")
    if path.is_dir():
        raise SpecError(f"{path}: is a directory, expected an experiment .yaml file")
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise SpecError(f"{path}: not a text file (it contains NUL bytes); expected an "
                        "experiment .yaml file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                        f"{exc.start}); save the experiment file as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise SpecError(f"{path}: YAML syntax error at {where}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: YAML error: {exc}") from None
    return from_dict(data, source=str(path), registry=registry)


def from_dict(data: Any, *, source: str = "<experiment>", registry=None) -> Experiment:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of keys (name, op, baseline, ...), "
                        f"got {type(data).__name__}")
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: {_one_line(exc, data)}") from None
    validate_against_registry(exp, source=source, registry=registry)
    return exp


def _one_line(exc: ValidationError, data: dict) -> str:
    errors = exc.errors()
    err = errors[0]
    if err["loc"][:1] == ("candidates",) and isinstance(err.get("input"), dict):
        # a {name, impl, config} item: report what NamedConfig says, not "not a string"
        err = next((e for e in errors if "NamedConfig" in e["loc"]), err)
    loc = [str(x) for x in err["loc"]]
    # pydantic reports union members as extra loc entries ("list[...]", "int"): drop them
    loc = [x for x in loc if not x.startswith(("list[", "dict[", "function-")) and x not in
           ("bool", "int", "float", "str", "literal['first','all']", "NcuOptions", "NsysOptions",
            "NamedConfig")]
    field = _path(loc) or "(top level)"
    etype = err["type"]
    if etype == "extra_forbidden":
        parent = loc[:-1]
        model = _model_at(parent)
        valid = ", ".join(model.model_fields) if model else "?"
        where = _path(parent) or "top level"
        return f"unknown key {loc[-1]!r} at {where} (valid keys: {valid})"
    if etype == "missing":
        return f"{field}: required key is missing"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return f"{field}: {msg} (got {err.get('input')!r})"


def _path(loc: list[str]) -> str:
    """['candidates', '1', 'name'] -> 'candidates[1].name'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def _model_at(path: list[str]):
    model: Any = Experiment
    for part in path:
        if part.isdigit():  # a list index: the item's model is the list's
            continue
        f = getattr(model, "model_fields", {}).get(part)
        if f is None:
            return None
        ann = f.annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args, *(a for x in args for a in getattr(x, "__args__", ()))]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)),
                     None)
        if model is None:
            return None
    return model


def validate_against_registry(exp: Experiment, *, source: str, registry=None) -> None:
    from harness.registry import registry as default_registry

    reg = registry or default_registry()
    try:
        op = reg.get_op(exp.op)
    except HarnessError as exc:
        raise SpecError(f"{source}: op: {exc}") from None
    validate_candidates(exp, op, source)
    for i, d in enumerate(exp.dtypes):
        canon = DTYPE_ALIASES.get(str(d).lower())
        if canon is None or canon not in op.dtypes:
            raise SpecError(f"{source}: dtypes[{i}]: unknown dtype {d!r} for op {op.name!r} "
                            f"(valid: {', '.join(op.dtypes)})")
    if not exp.dtypes:
        raise SpecError(f"{source}: dtypes: empty list (valid: {', '.join(op.dtypes)})")
    if (exp.sweep is None) == (exp.cases is None):
        raise SpecError(f"{source}: give exactly one of 'sweep' (cartesian) or 'cases' (explicit "
                        f"list); parameters of op {op.name!r}: {', '.join(op.param_names())}")
    if exp.sweep is not None:
        if not exp.sweep:
            raise SpecError(f"{source}: sweep: empty; give values for the parameters of op "
                            f"{op.name!r}: {', '.join(op.param_names())}")
        _check_values(op, exp.sweep, f"{source}: sweep", lists=True)
    else:
        if not exp.cases:
            raise SpecError(f"{source}: cases: empty list; each case maps the parameters of op "
                            f"{op.name!r}: {', '.join(op.param_names())}")
        for i, c in enumerate(exp.cases):
            _check_values(op, c, f"{source}: cases[{i}]", lists=False)
    _check_values(op, exp.params, f"{source}: params", lists=False)
    if exp.smoke is not None:
        _check_values(op, exp.smoke, f"{source}: smoke", lists=True)
    # every parameter must get a value from sweep/cases/params or a default
    given = set(exp.params)
    if exp.sweep is not None:
        given |= set(exp.sweep)
    for name in op.param_names():
        p = op.param(name)
        if p.default is not None:
            continue
        if exp.sweep is not None and name not in given:
            raise SpecError(f"{source}: sweep: missing parameter {name!r} of op {op.name!r} "
                            f"(parameters: {', '.join(op.param_names())})")
        if exp.cases is not None:
            for i, c in enumerate(exp.cases):
                if name not in c and name not in exp.params:
                    raise SpecError(f"{source}: cases[{i}]: missing parameter {name!r} of op "
                                    f"{op.name!r} (parameters: {', '.join(op.param_names())})")
    both = set(exp.params) & (set(exp.sweep or {}))
    if both:
        raise SpecError(f"{source}: params: {sorted(both)[0]!r} is also in sweep; give it once")
    ncu = exp.profile.ncu
    if ncu is not None and isinstance(ncu.cases, list) and not ncu.cases:
        raise SpecError(f"{source}: profile.ncu.cases: empty list (use first, all, or case ids)")


def _check_values(op, mapping: dict, where: str, *, lists: bool) -> None:
    names = op.param_names()
    for key, raw in mapping.items():
        if key == "dtypes" and where.endswith("smoke"):
            for i, d in enumerate(_as_list(raw)):
                canon = DTYPE_ALIASES.get(str(d).lower())
                if canon is None or canon not in op.dtypes:
                    raise SpecError(f"{where}.dtypes[{i}]: unknown dtype {d!r} "
                                    f"(valid: {', '.join(op.dtypes)})")
            continue
        if key not in names:
            raise SpecError(f"{where}.{key}: unknown parameter for op {op.name!r} "
                            f"(parameters: {', '.join(names)})")
        p = op.param(key)
        values = _as_list(raw) if lists else [raw]
        if lists and not values:
            raise SpecError(f"{where}.{key}: empty list; give at least one {p.type_name()}")
        for i, v in enumerate(values):
            field = f"{where}.{key}[{i}]" if lists and isinstance(raw, list) else f"{where}.{key}"
            _check_scalar(p, v, field)


def _check_scalar(p, v, field: str) -> None:
    ok = isinstance(v, p.type) and not (p.type is int and isinstance(v, bool))
    if p.type is float and isinstance(v, int) and not isinstance(v, bool):
        ok = True
    if not ok:
        raise SpecError(f"{field}: expected {p.type_name()}, got {v!r}")
    if p.type is int and v <= 0:
        raise SpecError(f"{field}: expected a positive integer, got {v!r}")
    if p.choices is not None and v not in p.choices:
        raise SpecError(f"{field}: {v!r} is not one of {', '.join(map(str, p.choices))}")


def _as_list(v) -> list:
    return list(v) if isinstance(v, list) else [v]


# ---------------------------------------------------------------------------------------------
# expansion

def canonical_dtype(d: str) -> str:
    return DTYPE_ALIASES[str(d).lower()]


def expand(exp: Experiment, *, smoke: bool = False, registry=None) -> list[Case]:
    """All cases, in a stable order: dtype, then parameter combination, then impl."""
    from harness.registry import registry as default_registry

    op = (registry or default_registry()).get_op(exp.op)
    overrides = dict(exp.smoke or {}) if smoke else {}
    dtypes = _as_list(overrides.pop("dtypes", exp.dtypes))
    combos: list[dict] = []
    if exp.sweep is not None:
        grid = {k: _as_list(v) for k, v in exp.sweep.items()}
        grid.update({k: _as_list(v) for k, v in overrides.items()})
        keys = [n for n in op.param_names() if n in grid]
        for values in itertools.product(*(grid[k] for k in keys)):
            combos.append(dict(zip(keys, values)))
    else:
        for c in exp.cases or []:
            keys = list(overrides)
            for values in itertools.product(*(_as_list(overrides[k]) for k in keys)):
                combos.append({**c, **dict(zip(keys, values))})
    cases: list[Case] = []
    seen: set[str] = set()
    for d in dtypes:
        dtype = canonical_dtype(d)
        for combo in combos:
            full = {}
            for p in op.params:
                if p.name in combo:
                    full[p.name] = combo[p.name]
                elif p.name in exp.params:
                    full[p.name] = exp.params[p.name]
                else:
                    full[p.name] = p.default
            params = tuple((p.name, full[p.name]) for p in op.params)
            for cand in candidate_list(exp):
                role = "baseline" if cand.name == exp.baseline else "candidate"
                case = Case(op=op.name, impl=cand.name, role=role, params=params, dtype=dtype,
                            base_impl=cand.impl if cand.impl != cand.name else "",
                            config=cand.config)
                if case.case_id not in seen:
                    seen.add(case.case_id)
                    cases.append(case)
    return cases


def split_patterns(patterns: str) -> list[str]:
    """`--cases` items: comma-separated, except commas inside `[...]` (variant names)."""
    import re

    return [p.strip() for p in re.split(r",(?![^\[]*\])", patterns) if p.strip()]


def glob_matches(case_id: str, name_id: str, pattern: str) -> bool:
    """`profile.ncu.cases` items: a glob over the case id or over `<candidate name>.<shape>`
    (brackets of variant names taken literally there)."""
    import fnmatch
    import re

    literal = re.sub(r"([\[\]])", r"[\1]", pattern)
    return (fnmatch.fnmatchcase(case_id, pattern) or fnmatch.fnmatchcase(name_id, pattern)
            or fnmatch.fnmatchcase(name_id, literal))


def matches(case_id: str, name_id: str, pattern: str) -> bool:
    """A `--cases` pattern: a glob (see glob_matches), or a substring of the case id or of
    `<candidate name>.<shape>` (so `triton_flash[BLOCK_M=64` works as typed)."""
    return glob_matches(case_id, name_id, pattern) or pattern in case_id or pattern in name_id


def select(cases: list[Case], patterns: str | None) -> list[Case]:
    """Filter by `--cases`: comma-separated globs matched against case ids (or substrings)."""
    if not patterns:
        return cases
    pats = split_patterns(patterns)
    chosen = [c for c in cases
              if any(matches(c.case_id, f"{c.impl}.{c.shape_id}", p) for p in pats)]
    if not chosen:
        example = cases[0].case_id if cases else "(no cases)"
        raise HarnessError(f"--cases: {patterns!r} matches no case (ids look like {example!r})")
    return chosen


def spec_hash(exp: Experiment) -> str:
    data = exp.model_dump(mode="json")
    if data.get("variants") is None:  # experiments without variants keep their old hash
        data.pop("variants", None)
    if (data.get("timing") or {}).get("processes") is None:  # nor the default processes
        data["timing"].pop("processes", None)
    blob = json.dumps(data, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
