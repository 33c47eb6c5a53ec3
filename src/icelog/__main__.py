import sys

from icelog.cli.main import main

if __name__ == "__main__":  # not when the validation process (spawn) imports this module as __mp_main__
    sys.exit(main())
