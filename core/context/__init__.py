"""Context management (SPEC §5): token counts, windows, pressure, compaction, TACO."""
