"""The leader-side services of one node, built over its facade and run beside it.

Owns `LeaderServices`: the system log view (`SystemLog`), delayed messages
(`ScheduleService`), consumer groups (`GroupService`),
transactional messages (`TransactionService` and the
producers' check streams, `CheckRegistry`), their tasks and their gauges. The
server builds it after the node and starts it after the node starts; the client
service answers transactional RPCs through it. A service that fails stops the
node (`RaftNode.stop_on`), as a failed loop of the node's own does.
"""

from __future__ import annotations

import asyncio

from dledger_commitlog.messaging.group_admin import GroupAdmin
from dledger_commitlog.messaging.groups import GroupService
from dledger_commitlog.messaging.schedule import ScheduleService
from dledger_commitlog.messaging.system_log import SystemLog
from dledger_commitlog.messaging.transactions import CheckRegistry, TransactionService
from dledger_commitlog.node.config import NodeConfig, parse_levels
from dledger_commitlog.node.metrics import NodeMetrics
from dledger_commitlog.node.node import RaftNode

GAUGES_INTERVAL_S = 1.0


class LeaderServices:
    def __init__(self, node: RaftNode, cfg: NodeConfig, metrics: NodeMetrics) -> None:
        self._node = node
        self._metrics = metrics
        self.system_log = SystemLog(node)
        self.schedule = ScheduleService(self.system_log, parse_levels(cfg.delay_levels))
        self.schedule.on_delivered = metrics.scheduled_delivered.inc
        self.checks = CheckRegistry()
        self.transactions = TransactionService(
            self.system_log,
            self.checks,
            check_timeout_ms=cfg.check_timeout_ms,
            check_interval_ms=cfg.check_interval_ms,
            max_checks=cfg.max_checks,
        )
        self.groups = GroupService(
            self.system_log,
            self.schedule.levels,
            queues_per_topic=cfg.queues_per_topic,
            session_timeout_ms=cfg.group_session_timeout_ms,
            heartbeat_interval_ms=cfg.group_heartbeat_interval_ms,
            max_timer_delay_s=cfg.max_timer_delay_s,
        )
        self.group_admin = GroupAdmin(self.groups)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.schedule.run(), name="schedule"),
            loop.create_task(self.transactions.run(), name="transactions"),
            loop.create_task(self.groups.run(), name="consumer-groups"),
            loop.create_task(self._gauges(), name="messaging-gauges"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._node.stop_on(task.exception(), task.get_name())

    async def _gauges(self) -> None:
        metrics = self._metrics
        while True:
            await asyncio.sleep(GAUGES_INTERVAL_S)
            metrics.scheduled_backlog.set(self.schedule.backlog())
            metrics.pending_halves.set(self.transactions.pending)
            metrics.set_groups(self.group_admin.summaries())

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # failures: reported
