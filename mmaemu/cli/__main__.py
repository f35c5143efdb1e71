"""``python -m mmaemu.cli``, as ``python -m mmaemu``."""

import sys

from . import main

sys.exit(main())
