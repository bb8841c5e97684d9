# dledger-py node image: `docker compose up` runs three of these behind Toxiproxy.
# The entry point is the `dledger` CLI; compose passes `serve ...` as the command.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
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
RUN pip install . && rm -rf /src/build

WORKDIR /data
VOLUME /data
# client, raft, metrics (compose gives node i ports 700i, 710i, 720i)
EXPOSE 7001 7101 7201
ENTRYPOINT ["dledger"]
CMD ["--help"]
