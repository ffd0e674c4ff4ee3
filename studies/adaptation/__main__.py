"""``python -m studies.adaptation``: the adaptation study (:func:`studies.adaptation.cli.adaptation_main`)."""

import sys

from studies.adaptation.cli import adaptation_main

sys.exit(adaptation_main())
