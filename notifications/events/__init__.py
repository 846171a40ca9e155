"""Semantic events and notification types (docs/TYPES.md): upstream services send ``order_shipped``
with a user and data; the type decides channels, content, priority, quiet hours and routing."""
