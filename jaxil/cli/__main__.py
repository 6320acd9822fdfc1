import sys

from jaxil.cli.main import main

sys.exit(main())
