"""Ops and their implementations. Each sub-package registers one `Op` named `op`.

See harness/registry.py for the contract; kernels/softmax is the smallest complete example.
"""
