"""``python -m bridge.emulator``."""

import sys

from bridge.emulator.cli import main

sys.exit(main())
