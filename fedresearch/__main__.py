"""`python -m fedresearch` is the `fedresearch` command."""

import sys

from fedresearch.cli import main

sys.exit(main())
