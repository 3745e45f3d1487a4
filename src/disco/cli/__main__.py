"""``python -m disco.cli``: the ``disco`` command."""

import sys

from . import main

sys.exit(main())
