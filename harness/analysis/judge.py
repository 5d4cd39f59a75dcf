"""The verdict on one pair of a comparison: which evidence judges it, and the mark it gets.

    missing    a side has no samples
    unjudged   either run timed on the CPU: a ratio and its CI, never a mark ("CPU: not
               judged"); interpreter wall-clock says nothing about GPU speed
    paired     the two runs are the pair one `harness ab` stored: the paired ratio of its
               interleaved rounds (analysis.paired)
    measured   both cases carry their per-process medians: the band from their own
               between-process spread (analysis.spread)
    floor      otherwise (runs stored before the time pass used several processes, or
               `compare --noise-floor`): the A/A floor of analysis.noise, as before

The measured and floor rules then use analysis.compare.compare_samples: p < 0.01 and the whole
bootstrap CI beyond ±max(band, the pair's within-run MDE); a change of unchanged code that the
SM clock's move explains is not credited, nor a speed-up of a case that failed correctness.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from harness import op_card, store
from harness.analysis import noise as noisemod
from harness.analysis import paired as pairedmod
from harness.analysis import spread
from harness.analysis.diff import (TimeDiff, change_text, clock_explained, clock_ratio,
                                   compare_samples, same_code)
from harness.values import finite as _num

Z_MDE = 1.96 + 0.8416  # two-sided 95 %, 80 % power


def ab_rounds(base_dir: Path, cand_dir: Path, mb: dict, mc: dict):
    """(rounds by case id, min effect, flipped) when the two runs are one `harness ab` pair
    (flipped: the base given is the ab head), else None."""
    for head, base, m_head, m_base, flipped in ((cand_dir, base_dir, mc, mb, False),
                                                 (base_dir, cand_dir, mb, mc, True)):
        ab = m_head.get("ab") or {}
        if ab.get("role") == "head" and ab.get("base_run") == m_base.get("run_id"):
            rounds = store.load_ab(head)
            by_case = {c: g.sort_values("round") for c, g in rounds.groupby("case_id")}
            return by_case, float(ab.get("min_effect") or pairedmod.MIN_EFFECT), flipped
    return None


class Judge:
    def __init__(self, base_dir: Path, cand_dir: Path, mb: dict, mc: dict,
                 pairs: list[dict], base_rows: dict, cand_rows: dict, *,
                 noise: float | None, alpha: float, cpu: bool):
        self.base_dir, self.cand_dir, self.mc = base_dir, cand_dir, mc
        self.base_rows, self.cand_rows = base_rows, cand_rows
        self.noise, self.alpha, self.cpu = noise, alpha, cpu
        self.ab = ab_rounds(base_dir, cand_dir, mb, mc)
        self.rule = spread.Rule(min_effect=self.ab[1] if self.ab else None)
        self.evidence: dict[tuple[str, str], spread.Evidence] = {}
        cases = []
        if noise is None and not cpu:
            for r in pairs:
                rb = base_rows[r["case_id_b"]]
                xa = spread.log_medians(rb.get("process_medians_ms"))
                xb = spread.log_medians(cand_rows[r["case_id_c"]].get("process_medians_ms"))
                if xa is not None and xb is not None:
                    e = spread.Evidence(xa, xb)
                    key = (r["case_id_b"], r["case_id_c"])
                    self.evidence[key] = e
                    cases.append((key, r["impl"], float(xa.mean()), e))
        self.priors = spread.priors(cases)

    def _floor(self):
        if self.rule.floor is None:  # scans the store for A/A pairs: only when needed
            self.rule.floor = noisemod.floor_for(self.base_dir, self.cand_dir, floor=self.noise)
        return self.rule.floor

    def verdict(self, r: dict, rb: dict, rc: dict, xb, xc, row: dict) -> dict:
        """The time columns of one pair with samples on both sides."""
        rounds = self.ab[0].get(r["case_id_c" if not self.ab[2] else "case_id_b"]) \
            if self.ab else None
        if rounds is not None and len(rounds):
            out = self._paired(rounds, row)
            return self._unjudged_paired(out) if self.cpu else out
        if self.cpu:
            return self._unjudged(xb, xc)
        e = self.evidence.get((r["case_id_b"], r["case_id_c"]))
        if e is not None:
            band, _, _ = spread.band(e, self.priors.get((r["case_id_b"], r["case_id_c"])))
            self.rule.measured.append(band)
            self.rule.processes.add((len(e.xa), len(e.xb)))
            method = "measured"
        else:
            floor = self._floor()
            band = floor.for_impl(r["impl"], op_card.backend(self.mc, r["op"], r["impl"],
                                                             rc.get("base_impl")))
            self.rule.fallback += 1
            method = "floor"
        band = max(band, noisemod.pair_mde(xb, xc))
        d = compare_samples(xb, xc, noise=band, alpha=self.alpha)
        mark, text = d.mark, d.change_text()
        k = clock_ratio(rb, rc)
        by_clock = clock_explained(d, k, band, same_code(rb, rc))
        if by_clock:
            mark = "ambiguous"
            text = (f"not credited: {text}, but the SM clock under load moved "
                    f"{_num(rb.get('sm_clock_timed_mhz')):.0f} → "
                    f"{_num(rc.get('sm_clock_timed_mhz')):.0f} MHz, which alone explains up "
                    f"to {max(k, 1 / k):.2f}x")
        mark, text = self._credit(row, mark, text)
        return {"ratio": d.ratio, "ci_low": d.ci_low, "ci_high": d.ci_high,
                "p_value": d.p_value, "mark": mark, "text": text, "threshold": band,
                "clock_explained": by_clock, "mde": _mde(band, d), "method": method}

    def _paired(self, rounds: pd.DataFrame, row: dict) -> dict:
        base, head = rounds.base_ms.to_numpy(float), rounds.head_ms.to_numpy(float)
        if self.ab[2]:  # compare HEAD BASE: the candidate given is the ab base
            base, head = head, base
        p = pairedmod.paired(base, head, min_effect=self.ab[1])
        self.rule.paired.append(p.mde)
        mark, text = self._credit(row, p.mark, p.text)
        return {"ratio": 1 / p.ratio, "ci_low": 1 / p.ci_high, "ci_high": 1 / p.ci_low,
                "p_value": p.p_value, "mark": mark, "text": text, "threshold": p.band,
                "clock_explained": False, "mde": p.mde, "method": "paired"}

    def _unjudged_paired(self, out: dict) -> dict:
        self.rule.paired.pop()
        self.rule.unjudged += 1
        ratio = out["ratio"]
        change = change_text(ratio, 3)
        lo, hi = (out["ci_low"], out["ci_high"]) if ratio >= 1 else (1 / out["ci_high"],
                                                                     1 / out["ci_low"])
        return {**out, "mark": "unjudged", "mde": math.nan, "method": "cpu",
                "text": f"CPU: not judged (paired {change}, interpreter wall-clock; CI "
                        f"{lo:.2f}–{hi:.2f})"}

    def _unjudged(self, xb, xc) -> dict:
        self.rule.unjudged += 1
        d = compare_samples(xb, xc, noise=noisemod.pair_mde(xb, xc), alpha=self.alpha)
        ratio = d.ratio
        change = change_text(ratio)
        return {"ratio": ratio, "ci_low": d.ci_low, "ci_high": d.ci_high,
                "p_value": d.p_value, "mark": "unjudged",
                "text": f"CPU: not judged ({change}, interpreter wall-clock; {d.ci_text()})",
                "threshold": math.nan, "clock_explained": False, "mde": math.nan,
                "method": "cpu"}

    @staticmethod
    def _credit(row: dict, mark: str, text: str) -> tuple[str, str]:
        if not (row["base_correct"] and row["cand_correct"]) and mark == "faster":
            who = "candidate" if not row["cand_correct"] else "base"
            return "ambiguous", f"not credited: the {who} case failed correctness ({text})"
        return mark, text


def _mde(band: float, d: TimeDiff) -> float:
    """The smallest change this pair would mark with 80 % power: its band plus what the
    spread of its CI costs (the CI's half width in log space, as a standard error)."""
    if not (d.ci_low > 0 and d.ci_high > 0):
        return math.nan
    se = math.log(d.ci_high / d.ci_low) / (2 * 1.96)
    return float(np.expm1(math.log1p(band) + Z_MDE * se))
