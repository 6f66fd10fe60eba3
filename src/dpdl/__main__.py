import sys

from dpdl.cli import main

sys.exit(main())
