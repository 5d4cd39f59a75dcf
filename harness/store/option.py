"""`--store DIR`: the one name every verb uses for the store root (default `runs/`).

Verbs that used to call it `--out` (run, show, import, calibrate, doctor) keep that spelling as
an alias. `report --out` is the report folder, not the store, and stays what it is.
"""
from __future__ import annotations

import argparse

DEFAULT_STORE = "runs"


def add_store_argument(p: argparse.ArgumentParser, *, out_alias: bool = False,
                       help: str = "store root (default: runs/)") -> None:
    """Add `--store DIR` (dest `store`); with out_alias, `--out DIR` means the same."""
    names = ["--store", "--out"] if out_alias else ["--store"]
    if out_alias:
        help += "; --out is the older spelling"
    p.add_argument(*names, dest="store", default=DEFAULT_STORE, metavar="DIR", help=help)
