"""A payments MCP server for crash tests: `charge(customer, cents, idempotency_key=None)`.

Run as `python -m graph_durable.testing.scenarios.mcp_server PROVIDER_FILE` (stdio, as
`langchain-mcp-adapters` starts it for each call). Each charge is applied to a
`FakeProvider` in `dedupe` mode kept in `PROVIDER_FILE`, so it survives the server
process: a charge given an `idempotency_key` it has seen returns the first charge; a
charge without one is a new charge every time, as with a real payments API. Needs the
`mcp` extra.
"""

from __future__ import annotations

import sys
import uuid

from mcp.server.fastmcp import FastMCP

from graph_durable.testing.providers import FakeProvider

__all__ = ["serve"]


def serve(provider_file: str) -> None:
    """Serve `charge` on stdio until the client closes it."""
    payments = FakeProvider(provider_file, "dedupe", name="payments")
    server = FastMCP("payments")

    @server.tool()
    def charge(customer: str, cents: int, idempotency_key: str | None = None) -> str:
        """Charge a customer `cents`; the same idempotency_key never charges twice."""
        key = idempotency_key or f"unkeyed-{uuid.uuid4().hex}"
        receipt = payments.apply(key, {"customer": customer, "cents": cents})
        return f"charged {receipt['id']}"

    server.run("stdio")


if __name__ == "__main__":
    serve(sys.argv[1])
