import sys

from .bundle import main

sys.exit(main())
