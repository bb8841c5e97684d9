# dledger-py node image, in two stages: the first builds the project's wheel, the second
# installs it without extras (no [analytics] or [chaos]: what a node, the CLI and the
# console need) and runs as an unprivileged user. `docker compose up` runs three of
# these behind Toxiproxy (compose passes `serve ...`); deploy/kubernetes runs them as a
# StatefulSet (`serve --from-env`, docs/kubernetes.md).
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY h2grpc ./h2grpc
COPY netkit ./netkit
COPY raft ./raft
COPY raftio ./raftio
COPY store ./store
COPY dispatch ./dispatch
COPY dledger_commitlog ./dledger_commitlog
COPY analytics ./analytics
COPY chaos ./chaos
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install /wheels/dledger_py-*.whl && rm -rf /wheels \
    && groupadd --system --gid 10001 dledger \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin dledger \
    && mkdir /data && chown 10001:10001 /data

# the node's files: compose's named volumes and Kubernetes' volumes are mounted here
WORKDIR /data
VOLUME /data
USER 10001:10001
# client, raft, metrics (compose gives node i ports 700i, 710i, 720i)
EXPOSE 7001 7101 7201
ENTRYPOINT ["dledger"]
CMD ["--help"]
