"""Entry script of the Halaman launcher (standard library only). In an unpacked release:
`python3 launch.py install`; once installed it lives in <prefix>/lib and bin/halaman runs
`launch.py run`. See installer/README.md and halaman_launcher/__init__.py."""

import sys

if sys.version_info < (3, 11):  # noqa: UP036 - this file must run on an old Python to say so
    sys.exit(f"Halaman needs Python 3.11 or newer; this is {sys.version.split()[0]} ({sys.executable}).")

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from halaman_launcher.__main__ import main

sys.exit(main())
