from harness.execute import pycache

pycache.apply_here()  # before anything imports torch

from harness.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
