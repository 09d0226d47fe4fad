"""`python -m rocm_assets.cli`: the same as the `rocm-assets` script."""

import sys

from rocm_assets.cli.main import main

sys.exit(main())
