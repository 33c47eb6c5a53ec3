import sys

from icelog.cli.main import main

sys.exit(main())
