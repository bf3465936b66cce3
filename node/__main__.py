"""`python -m node` runs `diloco-node` (same as `python -m node.cli`)."""

import sys

from node.cli import main

sys.exit(main())
