"""MCP servers as tool sources (README: MCP servers): their configuration (`config`),
the sandboxed stdio transport (`stdio`), one supervised connection per server
(`connection`), their tools as Parley tools (`tools`) and the worker's set of servers
(`hub`). Only `config` is imported without the `mcp` SDK; the rest loads when a server
is configured."""
