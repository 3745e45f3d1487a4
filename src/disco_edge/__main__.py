"""``python -m disco_edge``: the torch-free node program."""

import sys

from .node import main

if __name__ == "__main__":
    sys.exit(main())
