"""`python -m server serve ...` (same as `pagode serve` and `python -m server.cli serve`)."""

import sys

from server.cli import main

sys.exit(main())
