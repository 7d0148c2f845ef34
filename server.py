"""`python server.py` starts the server, exactly as `fedresearch serve` does (same options)."""

import sys

from fedresearch.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
