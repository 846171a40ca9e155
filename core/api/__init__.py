"""API primitives shared by every app's REST API (docs/ARCHITECTURE.md, "Floors")."""
