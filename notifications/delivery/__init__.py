"""The delivery pipeline: one staged send path for both tiers (docs/ARCHITECTURE.md, "The send
path"). Entry point: :func:`notifications.delivery.pipeline.send_notifications`."""
