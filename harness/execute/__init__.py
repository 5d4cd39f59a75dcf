"""The execute stage: the runner (passes over a run's cases), the worker process
that touches the device, executors (local, per GPU, Ray), timing, correctness, compile-ahead,
previous picks, the profiler passes, `ab` (two versions interleaved) and calibration."""
