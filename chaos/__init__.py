"""chaos package: fault schedules (scenarios) against a real local cluster, and the
checker of what they did to the history.

The membership scenarios (chaos/membership.py) register themselves in
`chaos.scenarios.SCENARIOS` with `scenario`; imported here, so that whoever imports
any part of the package sees the registry complete, and the two modules import
each other in one direction only."""

from chaos import membership as _membership  # noqa: F401
