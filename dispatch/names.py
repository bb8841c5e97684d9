"""The reserved topic names of the store: what a user's topic may not be called.

Owns the names alone (no store code), so what checks a topic name, as the ACL and
the clients do, need not load the dispatcher.
"""

SYSTEM_TOPIC_PREFIX = "%SYS%"  # every topic the system keeps for itself
OFFSETS_TOPIC = SYSTEM_TOPIC_PREFIX + "OFFSETS"  # consumer offsets, committed through the log
