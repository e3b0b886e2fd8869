"""Pure mappings between stored memory and agent frameworks' own formats (no HTTP, no views)."""
