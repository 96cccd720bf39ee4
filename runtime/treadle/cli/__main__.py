"""``python -m treadle.cli``: the ``treadle`` command."""

from __future__ import annotations

import sys

from treadle.cli import main

if __name__ == "__main__":
    sys.exit(main())
