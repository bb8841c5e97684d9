"""`python -m dledger_commitlog ...`: the `dledger` command line (see `cli.py`)."""

from .cli import main

raise SystemExit(main())
