"""``python -m grader``: see `grader.cli`."""

import sys

from grader.cli import main

sys.exit(main())
