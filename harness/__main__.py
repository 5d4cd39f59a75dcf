from harness.execute import pycache

pycache.apply_here()  # before anything imports torch

from harness.cli import main  # noqa: E402
from harness.execute.quick_exit import quick_exit  # noqa: E402

if __name__ == "__main__":
    quick_exit(main())  # without the interpreter's teardown: harness.execute.quick_exit
