"""`python -m testnet`: the same as `diloco-testnet` (see `testnet.cli`)."""

import sys

from testnet.cli import main

sys.exit(main())
