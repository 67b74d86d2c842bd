"""Command-line entry points: one thin click command per tool (architecture.md, `cli/`)."""
