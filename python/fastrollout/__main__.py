"""``python -m fastrollout``: see :mod:`fastrollout.cli`."""

import sys

from fastrollout.cli import main

if __name__ == "__main__":
    sys.exit(main())
