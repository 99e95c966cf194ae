"""`python -m services tools|reward ...`: how a node (or a local run) starts a service."""

import sys

from services.commands import main

sys.exit(main())
