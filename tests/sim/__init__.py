"""Deterministic simulation of a whole Raft cluster in one thread.

`Simulation(seed).run(steps)` drives RaftCores over a seeded fake network and
fake disks with crashes, pauses and partitions; `checkers.Checker` verifies
the safety invariants after every step. `python -m tests.sim` runs many seeds.
"""
