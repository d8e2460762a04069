"""Context management (docs/context.md): token counts, windows, pressure, compaction, TACO."""
