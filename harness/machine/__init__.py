"""The machine: its fingerprint (GPU, driver, clocks, software), NVML, and `doctor`."""
