import sys

from tianji_dask.cli import main

sys.exit(main())
