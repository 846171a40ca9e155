"""Tests of provider backends, the registry and the provider emulator (no database needed)."""
