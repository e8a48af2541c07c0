"""``python -m pycollective.strategies.parameter_server``: run this process's TF_CONFIG task
(a ps or worker task) until SIGTERM or SIGINT."""

import sys

from .server import main

sys.exit(main())
