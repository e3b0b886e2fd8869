"""Reads, one module per audience: `lists` (cursor-paginated pages for the API and the MCP
tools), `dashboard` (context lists and chat-history windows), `logbook` (a run's steps, cost,
timeline and transcript for the dashboard) and `memories` (what a context recalls). Reads never
write; the services may use them."""
