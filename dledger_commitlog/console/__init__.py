"""The console: `dledger console`, an HTTP/1.1 JSON API (docs/http-api.md) that is a
client of the cluster.

`server` assembles the process; `http` is HTTP/1.1 over asyncio streams (llhttp parses);
`api` holds the message and view endpoints, `members` the consumer-group members
over HTTP; `params` reads a request's inputs strictly; `callers` says who a request
runs as (HTTP Basic with an ACL) and gives it that user's client; `refusals` maps
client errors to HTTP statuses; `views` are the JSON documents the CLI prints too.
It imports the client, never the server side (an import-linter contract says so).
"""
