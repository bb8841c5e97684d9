"""The node process, assembled: its shards (`shards`), its ports and its life
from start to a clean shutdown (`server`). The composition root: every part is
built here with explicit constructor arguments and handed what it needs."""
