"""Campaigns, segments and fan-out: built in the campaigns issue (DESIGN.md §7)."""
