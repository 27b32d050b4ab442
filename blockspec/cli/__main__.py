"""`python -m blockspec.cli ...` (as the bench/ scripts run it): the `blockspec` command."""

import sys

from blockspec.cli import main

sys.exit(main())
