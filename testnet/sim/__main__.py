"""``python -m testnet.sim`` — the same as the ``diloco-sim`` entry point."""

import sys

from testnet.sim.cli import main

sys.exit(main())
