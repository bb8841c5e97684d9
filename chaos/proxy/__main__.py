"""`python -m chaos.proxy ...`: the fault proxy as a process (see `serve.main`)."""

from chaos.proxy.serve import main

raise SystemExit(main())
