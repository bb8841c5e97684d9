"""A node under cProfile, for bench/put_profile.py --cprofile: the launcher's command
follows (`python -m dledger_commitlog serve --config ...`). SIGUSR1 starts profiling
the main thread (the event loop), SIGUSR2 stops it and writes
$DLEDGER_PROFILE_DIR/node-PID.prof: the window the bench measures, not start-up."""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
from types import FrameType

if __name__ == "__main__":
    del sys.path[0]  # bench/, where dispatch.py would hide the dispatch package
    _python, _dash_m, module, *rest = sys.argv[1:]
    sys.argv = [module, *rest]
    profile = cProfile.Profile()

    def start(_sig: int, _frame: FrameType | None) -> None:
        profile.enable()

    def stop(_sig: int, _frame: FrameType | None) -> None:
        profile.disable()
        profile.dump_stats(
            os.path.join(os.environ["DLEDGER_PROFILE_DIR"], f"node-{os.getpid()}.prof")
        )

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
