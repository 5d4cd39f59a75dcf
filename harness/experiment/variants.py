"""Candidates of an experiment: registered impls, named configs and variant grids.

    candidates:
      - triton_flash                                         # the Tuner picks per shape
      - {name: fa_m64, impl: triton_flash, config: {BLOCK_M: 64, BLOCK_N: 64}}
    variants:                                  # one candidate per combination:
      triton_flash: {BLOCK_M: [64, 128], num_stages: [2, 3]}  # triton_flash[BLOCK_M=64,...]

A config names an impl's tunables (`harness list` shows them; `dq.BLOCK_M` for a kernel's second
Tuner): all of a Tuner's fields force that launch configuration, some of them restrict the Tuner
to its candidates with those values. A `triton.autotune` kernel's configs are tunables the same
way (harness.tuning.autotune): its triton.Config kwargs, num_warps and num_stages. Each
candidate is an ordinary case impl: checked, timed, profiled, compared and reported by its name.

Case ids (also NVTX range names and `--cases` targets) must stay free of `/ @ , : [ ] . + *`:
`case_name` spells `triton_flash[BLOCK_M=64,dq.num_stages=2]` as
`triton_flash~BLOCK_M=64~dq-num_stages=2`; distinct candidates must keep distinct ids.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Union

from harness.errors import SpecError

Scalar = Union[bool, int, float, str]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


@dataclass(frozen=True)
class Candidate:
    """A name in the results, the registered impl it runs, and the tunables it fixes."""

    name: str
    impl: str
    config: tuple[tuple[str, Scalar], ...] = ()

    @property
    def config_dict(self) -> dict[str, Scalar]:
        return dict(self.config)


def fmt_value(v: Scalar) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def variant_name(impl: str, config: dict[str, Scalar]) -> str:
    """`impl[k=v,...]`, keys in the order given."""
    return f"{impl}[{','.join(f'{k}={fmt_value(v)}' for k, v in config.items())}]"


def case_name(name: str) -> str:
    """The case-id spelling of a candidate name (identity for plain impl and config names)."""
    s = name.replace("[", "~").replace(",", "~").replace("]", "").replace(".", "-")
    return re.sub(r"[^A-Za-z0-9_=~-]", "-", s)


def _as_list(v) -> list:
    return list(v) if isinstance(v, list) else [v]


def candidates(exp) -> list[Candidate]:
    """Baseline first, then `candidates` in order, then each `variants` grid (dict order, keys
    in the order given, values in the order given); a name given twice counts once."""
    named = {}
    for c in exp.candidates:
        if isinstance(c, str):
            named.setdefault(c, Candidate(c, c))
        else:
            named.setdefault(c.name, Candidate(c.name, c.impl, tuple(c.config.items())))
    for impl, grid in (exp.variants or {}).items():
        keys = list(grid)
        for values in itertools.product(*(_as_list(grid[k]) for k in keys)):
            cfg = dict(zip(keys, values))
            name = variant_name(impl, cfg)
            named.setdefault(name, Candidate(name, impl, tuple(cfg.items())))
    base = named.get(exp.baseline, Candidate(exp.baseline, exp.baseline))
    return [base] + [c for n, c in named.items() if n != exp.baseline]


# -- validation (spec load: one line naming the field, nothing written) -----------------------

def validate(exp, op, source: str) -> None:
    valid_impls = ", ".join(sorted(op.impls))
    tunable_impls = ", ".join(sorted(n for n, i in op.impls.items() if i.tunables())) or "(none)"
    names: set[str] = set()
    for i, c in enumerate(exp.candidates):
        where = f"{source}: candidates[{i}]"
        name = c if isinstance(c, str) else c.name
        if name in names:
            raise SpecError(f"{where}: {name!r} is given twice; give each candidate once")
        names.add(name)
        if isinstance(c, str):
            if c not in op.impls:
                raise SpecError(f"{where}: {c!r} is not an implementation of op {op.name!r} "
                                f"(registered: {valid_impls})")
            continue
        if c.impl not in op.impls:
            raise SpecError(f"{where}.impl: {c.impl!r} is not an implementation of op "
                            f"{op.name!r} (registered: {valid_impls})")
        if c.name in op.impls:
            raise SpecError(f"{where}.name: {c.name!r} is a registered implementation of op "
                            f"{op.name!r}; give the configured candidate another name")
        _check_config(op.impls[c.impl], c.config, f"{where}.config", tunable_impls)
    for impl, grid in (exp.variants or {}).items():
        where = f"{source}: variants.{impl}"
        if impl not in op.impls:
            raise SpecError(f"{where}: {impl!r} is not an implementation of op {op.name!r} "
                            f"(registered: {valid_impls})")
        if not grid:
            raise SpecError(f"{where}: empty; give tunables with lists of values (tunables: "
                            f"{_tunable_list(op.impls[impl])})")
        for key, raw in grid.items():
            if not _as_list(raw):
                raise SpecError(f"{where}.{key}: empty list; give at least one value")
        _check_grid(op.impls[impl], grid, where, tunable_impls)
    all_names = [c.name for c in candidates(exp)]
    if exp.baseline not in op.impls and exp.baseline not in names:
        raise SpecError(f"{source}: baseline: {exp.baseline!r} is not an implementation of op "
                        f"{op.name!r} nor a named candidate (registered: {valid_impls})")
    seen: dict[str, str] = {}
    for n in all_names:
        cid = case_name(n)
        if cid in seen and seen[cid] != n:
            raise SpecError(f"{source}: candidates {seen[cid]!r} and {n!r} would share the case "
                            f"id {cid!r}; rename one")
        seen[cid] = n


def _tunable_list(impl) -> str:
    return ", ".join(impl.tunables()) or "(none)"


def _check_names(impl, keys, where: str, tunable_impls: str) -> None:
    tunables = impl.tunables()
    if not tunables:
        raise SpecError(f"{where}: impl {impl.name!r} has no tunables (impls with tunables: "
                        f"{tunable_impls})")
    for k in keys:
        if k not in tunables:
            raise SpecError(f"{where}.{k}: unknown tunable of impl {impl.name!r} (tunables: "
                            f"{_tunable_list(impl)})")


def _check_value(impl, key: str, v, field: str) -> None:
    tuner, f = impl.tunables()[key]
    valid = tuner.valid_values(f)
    bools = any(isinstance(x, bool) for x in valid)  # a flag (an autotune kwarg `EVEN: True`)
    if isinstance(v, bool) != bools or v not in valid:
        raise SpecError(f"{field}: {v!r} is not a valid value of {key} for impl {impl.name!r} "
                        f"(valid: {', '.join(map(fmt_value, valid))})")


def _check_combination(impl, config: dict, where: str) -> None:
    tuners = impl.all_tuners()
    for tuner_name, fields in impl.split_config(config).items():
        tuner = next(t for t in tuners.values() if t.name == tuner_name)
        broken = tuner.violated(fields)
        if broken:
            prefix = next(p for p, t in tuners.items() if t is tuner)
            shown = ", ".join(f"{(prefix + '.') if prefix else ''}{k}={fmt_value(v)}"
                              for k, v in fields.items())
            raise SpecError(f"{where}: {shown} breaks {broken} (invalid combination for impl "
                            f"{impl.name!r})")


def _check_config(impl, config: dict[str, Any], where: str, tunable_impls: str) -> None:
    if not config:
        raise SpecError(f"{where}: empty; give tunables and values (tunables of "
                        f"{impl.name!r}: {_tunable_list(impl)})")
    _check_names(impl, config, where, tunable_impls)
    for k, v in config.items():
        _check_value(impl, k, v, f"{where}.{k}")
    _check_combination(impl, config, where)


def _check_grid(impl, grid: dict[str, Any], where: str, tunable_impls: str) -> None:
    _check_names(impl, grid, where, tunable_impls)
    for k, raw in grid.items():
        for i, v in enumerate(_as_list(raw)):
            _check_value(impl, k, v, f"{where}.{k}[{i}]" if isinstance(raw, list) else
                         f"{where}.{k}")
    keys = list(grid)
    for values in itertools.product(*(_as_list(grid[k]) for k in keys)):
        _check_combination(impl, dict(zip(keys, values)), where)
