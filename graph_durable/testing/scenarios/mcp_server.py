"""A payments MCP server for crash tests: `charge(customer, cents, ...)`.

Run as `python -m graph_durable.testing.scenarios.mcp_server PROVIDER_FILE` (stdio, as
`langchain-mcp-adapters` starts it for each call): `charge(customer, cents,
idempotency_key=None)` takes its key as an argument. With `--http PORT` it serves
streamable HTTP on 127.0.0.1 instead, and `charge(customer, cents)` takes its key from
the request's `Idempotency-Key` header. Each charge is applied to a `FakeProvider` in
`dedupe` mode kept in `PROVIDER_FILE`, so it survives the server process: a charge under
a key it has seen returns the first charge; a charge without a key is a new charge every
time, as with a real payments API. Needs the `mcp` extra.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from mcp.server.fastmcp import Context, FastMCP

from graph_durable.testing.providers import FakeProvider

__all__ = ["serve"]


def serve(provider_file: str, http_port: int | None = None) -> None:
    """Serve `charge` on stdio, or on streamable HTTP at `http_port`, until stopped."""
    payments = FakeProvider(provider_file, "dedupe", name="payments")

    def apply(customer: str, cents: int, key: str | None) -> str:
        receipt = payments.apply(key or f"unkeyed-{uuid.uuid4().hex}",
                                 {"customer": customer, "cents": cents})
        return f"charged {receipt['id']}"

    if http_port is None:
        server = FastMCP("payments")

        @server.tool()
        def charge(customer: str, cents: int, idempotency_key: str | None = None) -> str:
            """Charge a customer `cents`; the same idempotency_key never charges twice."""
            return apply(customer, cents, idempotency_key)

        server.run("stdio")
        return

    server = FastMCP("payments", host="127.0.0.1", port=http_port)

    @server.tool(name="charge")
    def charge_by_header(customer: str, cents: int, ctx: Context[Any, Any, Any]) -> str:
        """Charge a customer `cents`; the same Idempotency-Key header never charges twice."""
        request = ctx.request_context.request
        key = request.headers.get("idempotency-key") if request is not None else None
        return apply(customer, cents, key)

    server.run("streamable-http")


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[3]) if sys.argv[2:3] == ["--http"] else None)
