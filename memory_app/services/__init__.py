"""Writes, one module per entity: contexts, messages, runs (with their steps and tool calls),
memories, curation (prune, restore, bulk prune, purge, undo) and traces (OpenTelemetry spans into
runs). The REST API, the MCP tools, the dashboard and the commands all write through here."""
