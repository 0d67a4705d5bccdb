"""``python -m code2wav`` is the ``code2wav`` command."""

import sys

from code2wav.cli import main

sys.exit(main())
