import sys

from dsv4spec.cli import main

sys.exit(main())
