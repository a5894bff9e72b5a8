"""Developer tools (screenshots, UI latency): run from a source checkout, never shipped."""
