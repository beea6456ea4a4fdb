"""Run the offline model: `python -m actors.offline_model --port-file FILE`."""

import sys

from actors.offline_model.cli import main

sys.exit(main())
