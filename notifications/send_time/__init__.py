"""Send-time optimisation: each recipient's usual engagement hours (docs/SEND_TIME.md)."""
