"""Analysis over stored runs: per-case views, roofline placement, verdicts, validity, compare."""
