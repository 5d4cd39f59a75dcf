"""Profiler passes (ncu, nsys, torch.profiler fallback) and the canonical metric table."""
