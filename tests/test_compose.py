"""docker-compose.yml, Dockerfile and docker/ checked without a Docker engine.

The compose file is read by `read_yaml`, a small reader of the block-YAML subset
the file keeps to (mappings, `- item` sequences, scalars, JSON-style flow lists
that may span lines); every `dledger` command in it is parsed by the CLI's own
argparse tree, and every Raft hop is checked to go through a Toxiproxy proxy
that forwards to the right node.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

from dledger_commitlog.cli import admin
from dledger_commitlog.cli import main as cli
from dledger_commitlog.client import Client
from dledger_commitlog.node.config import parse_address

ROOT = Path(__file__).resolve().parent.parent


def read_yaml(text: str) -> Any:
    lines = []
    pending = ""
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if pending:  # inside a flow list spanning lines
            pending += " " + raw.strip()
            if pending.count("[") == pending.count("]"):
                lines.append(pending)
                pending = ""
            continue
        if raw.rstrip().endswith("[") or raw.count("[") > raw.count("]"):
            pending = raw.rstrip()
            continue
        lines.append(raw.rstrip())
    assert not pending, "unclosed flow list"
    value, end = _block(lines, 0, 0)
    assert end == len(lines), f"unparsed from line {lines[end]!r}"
    return value


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block(lines: list[str], i: int, indent: int) -> tuple[Any, int]:
    if lines[i].lstrip().startswith("- "):
        items = []
        while i < len(lines) and _indent(lines[i]) == indent and lines[i].lstrip()[:2] == "- ":
            items.append(_scalar(lines[i].strip()[2:]))
            i += 1
        return items, i
    mapping: dict[str, Any] = {}
    while i < len(lines) and _indent(lines[i]) == indent:
        key, sep, rest = lines[i].strip().partition(":")
        assert sep and key not in mapping, f"bad or duplicate key: {lines[i]!r}"
        i += 1
        if rest.strip():
            mapping[key] = _scalar(rest.strip())
        elif i < len(lines) and _indent(lines[i]) > indent:
            mapping[key], i = _block(lines, i, _indent(lines[i]))
        else:
            mapping[key] = None
    assert i == len(lines) or _indent(lines[i]) < indent, f"bad indentation: {lines[i]!r}"
    return mapping, i


def _scalar(text: str) -> Any:
    if text.startswith(("[", '"')):
        return json.loads(text)
    return int(text) if text.isdigit() else text


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = read_yaml((ROOT / "docker-compose.yml").read_text())
    return doc


def test_the_reader_reads_what_it_claims() -> None:
    doc = read_yaml('a:\n  b: [\n    "x", "y"\n  ]\n  c:\n    - "1:2"\n    - d\nn: 3\n')
    assert doc == {"a": {"b": ["x", "y"], "c": ["1:2", "d"]}, "n": 3}


def test_services_and_toxiproxy() -> None:
    services = compose()["services"]
    assert set(services) == {"toxiproxy", "n1", "n2", "n3"}
    tp = services["toxiproxy"]
    assert re.fullmatch(r"ghcr\.io/shopify/toxiproxy:2\.[0-9.]+", tp["image"])
    config_path = tp["command"][tp["command"].index("-config") + 1]
    (volume,) = tp["volumes"]
    source, target, *_ = volume.split(":")
    assert target == config_path and (ROOT / source).resolve() == ROOT / "docker/toxiproxy.json"
    assert "8474:8474" in tp["ports"]


def test_node_commands_parse_and_route_raft_through_toxiproxy() -> None:
    services = compose()["services"]
    proxies = {
        p["listen"].rpartition(":")[2]: p
        for p in json.loads((ROOT / "docker/toxiproxy.json").read_text())
    }
    assert len(proxies) == 6
    parser = cli.build_parser()
    raft_of: dict[int, str] = {}
    configs = {}
    for i in (1, 2, 3):
        svc = services[f"n{i}"]
        assert svc["build"] == "." and svc["depends_on"] == ["toxiproxy"]
        args = parser.parse_args(svc["command"])
        assert args.run is cli._serve
        config = cli.serve_config(args)
        assert config.node_id == i and svc["hostname"] == f"n{i}"
        configs[i] = config
        raft_of[i] = f"n{i}:{parse_address(config.raft_address)[1]}"
        client_port = parse_address(config.client_address)[1]
        assert f"{client_port}:{client_port}" in svc["ports"]
        assert config.me.client == f"n{i}:{client_port}"
        health = parser.parse_args(svc["healthcheck"]["test"][2:])
        assert svc["healthcheck"]["test"][:2] == ["CMD", "dledger"] and health.run is admin._status
    for i, config in configs.items():
        for peer in config.peers:
            host, port = parse_address(peer.raft)
            if peer.id == i:
                assert peer.raft == raft_of[i]
                continue
            assert host == "toxiproxy", f"n{i} reaches n{peer.id} directly"
            proxy = proxies[str(port)]
            assert proxy["name"] == f"n{i}_to_n{peer.id}" and proxy["enabled"]
            assert proxy["upstream"] == raft_of[peer.id]


def test_dockerfile_installs_every_package_and_runs_the_cli() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (.+)$", text, re.M)
    assert stages == ["python:3.11-slim AS build", "python:3.11-slim"]
    assert re.search(r'^ENTRYPOINT \["dledger"\]$', text, re.M)
    assert re.search(r"^RUN pip wheel --no-deps --wheel-dir /wheels \.$", text, re.M)
    assert re.search(r"^COPY --from=build /wheels /wheels$", text, re.M)
    # the base install: no extra (`[analytics]`, `[chaos]`) after the wheel's name
    assert re.search(r"^RUN pip install /wheels/dledger_py-\*\.whl ", text, re.M)
    copied = set()
    for line in re.findall(r"^COPY (?!--from=)(.+)$", text, re.M):
        *sources, _ = line.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            copied.add(source)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        if (ROOT / package / "__init__.py").exists():
            assert package in copied, f"the image misses package {package}"
    scripts = pyproject["project"].get("scripts", {})
    assert scripts.get("dledger") == "dledger_commitlog.cli.main:main"


def test_host_cluster_file_matches_the_published_ports() -> None:
    client = Client.from_cluster_file(ROOT / "docker/cluster.json")
    services = compose()["services"]
    published = [p.split(":")[0] for i in (1, 2, 3) for p in services[f"n{i}"]["ports"]]
    assert [s.rpartition(":")[2] for s in client.servers] == published[::2]
