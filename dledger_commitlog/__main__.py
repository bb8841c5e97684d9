"""`python -m dledger_commitlog ...`: the `dledger` command line (see `cli.py`)."""

from dledger_commitlog.cli.main import main

raise SystemExit(main())
