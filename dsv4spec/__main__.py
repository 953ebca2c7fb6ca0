import sys

from dsv4spec.cli import main

if __name__ == "__main__":      # a `spawn` worker of `verify --jobs` imports this module too
    sys.exit(main())
