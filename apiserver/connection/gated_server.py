"""uvicorn's Server, accepting through fair accept (connection/fair_accept.py) instead of the loop's own server.

uvicorn hands a passed-in socket to `loop.create_server`, whose accept loop takes every queued
connection it can; only `startup` changes here, so uvicorn's main loop, graceful shutdown
(`close()` on each server, then waiting for connections and tasks) and protocol stay its own.
"""

from __future__ import annotations

import socket

import uvicorn

from apiserver.connection.fair_accept import FairAcceptor
from apiserver.connection.http_protocol import BoundedHttpToolsProtocol, ConnectionPolicy
from poolserve.config import AcceptBalance


class GatedServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, policy: ConnectionPolicy, balance_by: AcceptBalance, max_connections: int
    ):
        super().__init__(config)
        self.policy = policy
        self.balance_by = balance_by
        self.max_connections = max_connections
        self.acceptors: list[FairAcceptor] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if not sockets:
            raise ValueError("GatedServer serves the supervisor's shared socket: pass it in `sockets`")
        await self.lifespan.startup()
        config = self.config

        def create_protocol() -> BoundedHttpToolsProtocol:
            return BoundedHttpToolsProtocol(
                config=config, server_state=self.server_state, app_state=self.lifespan.state, policy=self.policy
            )

        self.acceptors = [
            FairAcceptor(
                sock,
                create_protocol,
                self.policy.load,
                balance_by=self.balance_by,
                max_connections=self.max_connections,
                clients=self.policy.clients,
            )
            for sock in sockets
        ]
        for acceptor in self.acceptors:
            acceptor.start()
        # uvicorn's shutdown only calls close() on these, which is what stops accepting.
        self.servers = self.acceptors  # type: ignore[assignment]
        self.started = True
